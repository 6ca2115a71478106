"""torch_snapshot_to_trace.py - turns a PyTorch memory snapshot into a cuheap trace.

    python3 scripts/torch_snapshot_to_trace.py snapshot.pickle job.trace.gz [--device N]

A snapshot is what torch.cuda.memory._dump_snapshot(path) writes after
torch.cuda.memory._record_memory_history(): a pickle of plain dicts and lists,
read here with the standard library alone (no torch needed), and as plain data
only: a pickle that names any class or function is refused before anything of
it runs. Its device_traces
list every allocator event of a device; "alloc" becomes an allocation line,
"free_requested" (the program let go of the tensor) a free line; segment events
only give PyTorch's own peak reserved bytes, written on the last comment line
as pytorch_peak_reserved=, so cuheap-replay can print both side by side.
Output is gzip when the name ends in .gz; the format (version 1) is described in
bench/traces/README.md.
"""

import argparse
import gzip
import pickle
import sys


class SnapshotError(Exception):
    pass


class PlainUnpickler(pickle.Unpickler):
    """Loads plain data only. A memory snapshot is dicts, lists, strings and
    numbers; a pickle that names a class or function could run any code of
    its choosing while it loads, so no global is ever looked up."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "it refers to %s.%s, and a memory snapshot holds plain dicts and lists only (this script loads "
            "no classes or functions: unpickling them could run code)" % (module, name))


def load(path):
    try:
        with open(path, "rb") as f:
            snap = PlainUnpickler(f).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError) as e:
        raise SnapshotError("%s: cannot read a pickle: %s; is it a torch.cuda.memory._dump_snapshot() file?"
                            % (path, e))
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list):
        raise SnapshotError("%s: no device_traces: not a memory snapshot, or recorded without "
                            "torch.cuda.memory._record_memory_history()" % path)
    return snap


def convert(snap, device, out, source):
    traces = snap["device_traces"]
    if device >= len(traces):
        raise SnapshotError("device %d: the snapshot has %d device(s)" % (device, len(traces)))
    live = {}            # address -> id
    streams = {0: 0}     # raw stream -> trace stream number
    next_id = 0
    allocs = frees = unknown_frees = 0
    reserved = peak_reserved = 0
    first_time = None
    lines = []
    for i, e in enumerate(traces[device]):
        if not isinstance(e, dict) or "action" not in e:
            raise SnapshotError("device_traces[%d][%d]: not a trace entry" % (device, i))
        action = e["action"]
        t = e.get("time_us", i)
        if first_time is None:
            first_time = t
        t = max(0, t - first_time)
        try:
            if action == "alloc":
                size = e.get("requested_size", e["size"])
                stream = streams.setdefault(e.get("stream", 0), len(streams))
                live[e["addr"]] = next_id
                lines.append("a %d %d %d %d\n" % (t, next_id, size, stream))
                next_id += 1
                allocs += 1
            elif action == "free_requested":
                ident = live.pop(e["addr"], None)
                if ident is None:
                    unknown_frees += 1   # allocated before recording began
                    continue
                lines.append("f %d %d\n" % (t, ident))
                frees += 1
            elif action in ("segment_alloc", "segment_map"):
                reserved += e["size"]
                peak_reserved = max(peak_reserved, reserved)
            elif action in ("segment_free", "segment_unmap"):
                reserved -= e["size"]
        except KeyError as missing:
            raise SnapshotError("device_traces[%d][%d] (%s): no %s" % (device, i, action, missing))
    out.write("# trace v1 source=%s device=%d converted-by=torch_snapshot_to_trace.py\n" % (source, device))
    out.writelines(lines)
    out.write("# end allocs=%d frees=%d live_at_end=%d unmatched_frees=%d pytorch_peak_reserved=%d\n"
              % (allocs, frees, len(live), unknown_frees, peak_reserved))
    return allocs, frees, unknown_frees


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot")
    ap.add_argument("trace", help="output; gzip-compressed if it ends in .gz")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        snap = load(args.snapshot)
        opener = gzip.open if args.trace.endswith(".gz") else open
        with opener(args.trace, "wt") as out:
            allocs, frees, unmatched = convert(snap, args.device, out, args.snapshot.replace(" ", "_"))
    except SnapshotError as e:
        sys.stderr.write("torch_snapshot_to_trace: %s\n" % e)
        return 1
    except OSError as e:
        sys.stderr.write("torch_snapshot_to_trace: %s\n" % e)
        return 1
    sys.stderr.write("%s: %d allocations, %d frees%s\n" % (args.trace, allocs, frees,
                     ", %d frees of blocks allocated before recording began (left out)" % unmatched if unmatched else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
