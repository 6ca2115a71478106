"""jobs.py - the corpus's jobs: 27 PyTorch jobs, each a model and a step.

Every heap policy of cuheap is judged on the traces of these jobs
(bench/traces/corpus, `make corpus`), never on one of them. They spread the
way users' jobs spread: convolutional and transformer vision models at several
batch sizes, language models pretrained with and without activation
checkpointing and torch.compile, fine-tuning whose sequence length changes
every step, an encoder-decoder, generation with a KV cache, a diffusion-style
denoiser, fp16 with GradScaler, gradient accumulation, a whole training step
in a CUDA graph, a side stream fed from pinned memory, a held workspace under
a memory fraction, shapes that change every step, graphs, recurrent and
mixture-of-experts models, embedding tables, serving, speech, and jobs from
under 1 GiB to over 60 GiB live.

A job is make(seed) -> step(i), where step(i) runs step i and returns a loss
(a tensor or a float). Data are random with fixed seeds, models randomly
initialised and built on the GPU. The job never names an allocator: the
allocator is chosen by the environment (bench/corpus/record.py), as a user's
unchanged script would run. Standard library and torch (with torchvision,
transformers and torchaudio where a job says so), imported lazily.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Job:
    """big: runs alone on the GPU when traces are recorded. preload_cache: its
    LD_PRELOAD trace is recorded with PyTorch's cache on (the reason given)."""

    def __init__(self, name, about, make, steps=10, big=False, preload_cache=None):
        self.name, self.about, self.make, self.steps, self.big = name, about, make, steps, big
        self.preload_cache = preload_cache


JOBS = {}


def job(name, about, steps=10, big=False, preload_cache=None):
    def register(make):
        JOBS[name] = Job(name, about, make, steps, big, preload_cache)
        return make
    return register


# ---- helpers ----------------------------------------------------------------

def gen(seed, i):
    """The CUDA generator of step i's data: the same in every mode and run."""
    return torch.Generator(device="cuda").manual_seed(seed * 1000 + i)


def shapes(seed):
    """A host generator for the sizes that change from step to step."""
    return torch.Generator().manual_seed(seed)


def pick(g, lo, hi, multiple=1):
    """An integer in [lo, hi], a multiple of `multiple`."""
    return int(torch.randint(lo // multiple, hi // multiple + 1, (1,), generator=g)) * multiple


def optimize(opt, loss, scaler=None):
    opt.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss


def bf16():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def classifier(seed, build, batch, res, classes=1000, opt="adamw", autocast=True):
    """A training step of an image classifier on random images."""
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = build()
    model.train()
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if opt == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        g = gen(seed, i)
        x = torch.randn(batch, 3, res, res, device="cuda", generator=g)
        y = torch.randint(0, classes, (batch,), device="cuda", generator=g)
        if autocast:
            with bf16():
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        return optimize(optim, loss)
    return step


def tv(name, **kw):
    import torchvision
    return lambda: getattr(torchvision.models, name)(weights=None, **kw)


def llama(layers, width, ffn, heads=16, vocab=32000, positions=4096):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=width, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                         max_position_embeddings=positions)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    model.config.use_cache = False
    return model.train()


def lm_step(seed, model, opt, batch, seq, vocab, g_shapes=None, seq_range=None):
    """A causal-LM training step; with seq_range the length changes every step."""
    def step(i):
        s = pick(g_shapes, *seq_range, multiple=8) if seq_range else seq
        ids = torch.randint(0, vocab, (batch, s), device="cuda", generator=gen(seed, i))
        with bf16():
            loss = model(input_ids=ids, labels=ids).loss
        return optimize(opt, loss)
    return step


class GPT(nn.Module):
    """A compact decoder (pre-norm, fused attention), for the jobs that need a
    model without a library's indirections: torch.compile, the MoE variant,
    gradient accumulation and CUDA graphs."""

    def __init__(self, layers, width, heads, vocab, ffn=None, moe=None):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, ffn or 4 * width, moe) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids, labels):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))


class Block(nn.Module):
    def __init__(self, width, heads, ffn, moe):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ffn = MoE(width, ffn, *moe) if moe else nn.Sequential(nn.Linear(width, ffn), nn.GELU(),
                                                                    nn.Linear(ffn, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.ffn(self.n2(x))


class MoE(nn.Module):
    """Top-k routing over experts: every step sends a different number of
    tokens to each expert, so the experts' tensors change shape every step."""

    def __init__(self, width, ffn, experts, top):
        super().__init__()
        self.top = top
        self.router = nn.Linear(width, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, width, ffn) * width ** -0.5)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, width) * ffn ** -0.5)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weight, expert = self.router(x).softmax(-1).topk(self.top, dim=-1)
        out = torch.zeros_like(x)
        for e in range(self.w1.size(0)):
            rows, slot = (expert == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            h = F.gelu(x[rows] @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, (h * weight[rows, slot].unsqueeze(-1)).to(out.dtype))
        return out.view(shape)


# ---- vision -----------------------------------------------------------------

@job("resnet50_b64", "torchvision ResNet-50, batch 64, 224x224, SGD, bf16 autocast")
def resnet50_b64(seed):
    return classifier(seed, tv("resnet50"), 64, 224, opt="sgd")


@job("resnet50_b256", "torchvision ResNet-50, batch 256, 224x224, SGD, bf16 autocast")
def resnet50_b256(seed):
    return classifier(seed, tv("resnet50"), 256, 224, opt="sgd")


@job("efficientnet_b0", "torchvision EfficientNet-B0 (depthwise convolutions), batch 128, 224x224, AdamW, bf16")
def efficientnet_b0(seed):
    return classifier(seed, tv("efficientnet_b0"), 128, 224)


@job("vit_b16", "torchvision ViT-B/16, batch 64, 224x224, AdamW, bf16 autocast")
def vit_b16(seed):
    return classifier(seed, tv("vit_b_16"), 64, 224)


@job("swin_t", "torchvision Swin-T (windowed attention), batch 64, 224x224, AdamW, bf16 autocast")
def swin_t(seed):
    return classifier(seed, tv("swin_t"), 64, 224)


@job("mobilenet_small", "torchvision MobileNetV3-Small, batch 32, 160x160, SGD, fp32: a job under 1 GiB")
def mobilenet_small(seed):
    return classifier(seed, tv("mobilenet_v3_small"), 32, 160, opt="sgd", autocast=False)


@job("shapes_vary", "torchvision ResNet-18 on images whose batch (8-96) and height and width (96-448) "
     "change every step, SGD, bf16")
def shapes_vary(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = tv("resnet18")()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g_shapes = shapes(seed)

    def step(i):
        b, h, w = pick(g_shapes, 8, 96, 8), pick(g_shapes, 96, 448, 32), pick(g_shapes, 96, 448, 32)
        g = gen(seed, i)
        x = torch.randn(b, 3, h, w, device="cuda", generator=g)
        y = torch.randint(0, 1000, (b,), device="cuda", generator=g)
        with bf16():
            loss = F.cross_entropy(model(x), y)
        return optimize(opt, loss)
    return step


@job("sidestream_pinned", "torchvision ResNet-18, batch 128, 160x160, fed from pinned host batches copied on "
     "a side stream (non_blocking, record_stream), as prefetching loaders do")
def sidestream_pinned(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = tv("resnet18")()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    side = torch.cuda.Stream()
    host = torch.Generator().manual_seed(seed)
    pending = {}

    def prefetch(i):
        x = torch.randn(128, 3, 160, 160, generator=host).pin_memory()
        y = torch.randint(0, 1000, (128,), generator=host).pin_memory()
        with torch.cuda.stream(side):
            pending[i] = (x.cuda(non_blocking=True), y.cuda(non_blocking=True), side.record_event())

    prefetch(0)

    def step(i):
        x, y, ready = pending.pop(i)
        prefetch(i + 1)
        torch.cuda.current_stream().wait_event(ready)
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        with bf16():
            loss = F.cross_entropy(model(x), y)
        return optimize(opt, loss)
    return step


class UNet(nn.Module):
    """A small diffusion-style denoiser: a convolutional U-Net with a timestep
    embedding and self-attention at the lowest resolution."""

    def __init__(self, ch=(64, 128, 256, 512)):
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(128, 512), nn.SiLU(), nn.Linear(512, 512))
        self.inp = nn.Conv2d(3, ch[0], 3, padding=1)
        self.down, self.up, self.tproj = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for a, b in zip(ch, ch[1:]):
            self.down.append(nn.Sequential(nn.GroupNorm(32, a), nn.SiLU(), nn.Conv2d(a, b, 3, stride=2, padding=1),
                                           nn.GroupNorm(32, b), nn.SiLU(), nn.Conv2d(b, b, 3, padding=1)))
            self.tproj.append(nn.Linear(512, b))
        self.attn = nn.MultiheadAttention(ch[-1], 8, batch_first=True)
        for a, b in zip(reversed(ch[1:]), reversed(ch[:-1])):
            self.up.append(nn.Sequential(nn.GroupNorm(32, 2 * a), nn.SiLU(), nn.ConvTranspose2d(2 * a, b, 4, 2, 1),
                                         nn.GroupNorm(32, b), nn.SiLU(), nn.Conv2d(b, b, 3, padding=1)))
        self.out = nn.Conv2d(ch[0], 3, 3, padding=1)

    def forward(self, x, t):
        half = torch.arange(64, device=x.device) / 64
        e = t[:, None] * torch.exp(-math.log(10000) * half)[None]
        temb = self.temb(torch.cat([e.sin(), e.cos()], 1))
        h = self.inp(x)
        skips = []
        for d, p in zip(self.down, self.tproj):
            h = d(h) + p(temb)[:, :, None, None]
            skips.append(h)
        b, c, hh, ww = h.shape
        s = h.flatten(2).transpose(1, 2)
        h = h + self.attn(s, s, s, need_weights=False)[0].transpose(1, 2).view(b, c, hh, ww)
        for u in self.up:
            h = u(torch.cat([h, skips.pop()], 1))
        return self.out(h)


@job("unet_denoiser", "a diffusion-style U-Net denoiser (64-512 channels, attention at 8x8), batch 64, "
     "64x64, noise prediction, AdamW, bf16")
def unet_denoiser(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = UNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        g = gen(seed, i)
        x0 = torch.randn(64, 3, 64, 64, device="cuda", generator=g)
        noise = torch.randn(x0.shape, device="cuda", generator=g)
        t = torch.rand(64, device="cuda", generator=g)
        xt = (1 - t)[:, None, None, None].sqrt() * x0 + t[:, None, None, None].sqrt() * noise
        with bf16():
            loss = F.mse_loss(model(xt, t * 1000).float(), noise)
        return optimize(opt, loss)
    return step


# ---- language ---------------------------------------------------------------

@job("gpt2m_pretrain", "GPT-2 medium (24 layers, width 1024, transformers), batch 8 x 1024 tokens, AdamW, bf16")
def gpt2m_pretrain(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return lm_step(seed, model, opt, 8, 1024, 50257)


@job("llama_pretrain", "a Llama-style decoder (12 layers, width 1024, transformers), batch 8 x 2048, "
     "no checkpointing, AdamW, bf16")
def llama_pretrain(seed):
    torch.manual_seed(seed)
    model = llama(12, 1024, 2816)
    return lm_step(seed, model, torch.optim.AdamW(model.parameters(), lr=1e-4), 8, 2048, 32000)


@job("llama_ckpt", "a Llama-style decoder (12 layers, width 1024) with activation checkpointing, batch 16 x 1024, "
     "AdamW, bf16")
def llama_ckpt(seed):
    torch.manual_seed(seed)
    model = llama(12, 1024, 2816)
    model.gradient_checkpointing_enable()
    return lm_step(seed, model, torch.optim.AdamW(model.parameters(), lr=1e-4), 16, 1024, 32000)


@job("gpt_compile", "a compact GPT (8 layers, width 1024) under torch.compile, batch 8 x 1024, AdamW, bf16")
def gpt_compile(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT(8, 1024, 16, 32000)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    compiled = torch.compile(model)

    def step(i):
        ids = torch.randint(0, 32000, (8, 1025), device="cuda", generator=gen(seed, i))
        with bf16():
            loss = compiled(ids[:, :-1], ids[:, 1:])
        return optimize(opt, loss)
    step.cleanup = torch._dynamo.reset
    return step


@job("llama_60g", "a Llama-style decoder (20 layers, width 2048, 1.3B parameters), batch 10 x 2048, "
     "no checkpointing, AdamW, bf16: a job over 60 GiB", big=True)
def llama_60g(seed):
    torch.manual_seed(seed)
    model = llama(20, 2048, 5632)
    return lm_step(seed, model, torch.optim.AdamW(model.parameters(), lr=1e-4), 10, 2048, 32000)


class LoRA(nn.Module):
    def __init__(self, base, rank=16):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))

    def forward(self, x):
        return self.base(x) + (x @ self.a.t().to(x.dtype)) @ self.b.t().to(x.dtype)


@job("lora_varlen", "LoRA fine-tuning (rank 16 on q and v) of a frozen bf16 Llama-style model (16 layers, "
     "width 2048), batch 4, sequence 128-2048 changing every step, AdamW")
def lora_varlen(seed):
    torch.manual_seed(seed)
    model = llama(16, 2048, 5632).to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = LoRA(layer.self_attn.q_proj)
        layer.self_attn.v_proj = LoRA(layer.self_attn.v_proj)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return lm_step(seed, model, opt, 4, None, 32000, shapes(seed), (128, 2048))


@job("t5_base", "T5-base encoder-decoder (transformers), batch 32, source 512 and target 128 tokens, AdamW, bf16")
def t5_base(seed):
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = T5ForConditionalGeneration(T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12,
                                                    num_heads=12, vocab_size=32128, decoder_start_token_id=0,
                                                    pad_token_id=0, eos_token_id=1)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        g = gen(seed, i)
        src = torch.randint(0, 32128, (32, 512), device="cuda", generator=g)
        tgt = torch.randint(0, 32128, (32, 128), device="cuda", generator=g)
        with bf16():
            loss = model(input_ids=src, labels=tgt).loss
        return optimize(opt, loss)
    return step


@job("gpt2_generate", "GPT-2 small generate() with its KV cache, greedy, bf16: batch 1-32, prompt 32-512 and "
     "8-32 new tokens, all changing every call")
def gpt2_generate(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config()).to(torch.bfloat16).eval()
    g_shapes = shapes(seed)

    def step(i):
        b, p, n = pick(g_shapes, 1, 32), pick(g_shapes, 32, 512), pick(g_shapes, 8, 32)
        ids = torch.randint(0, 50257, (b, p), device="cuda", generator=gen(seed, i))
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        return out.float().mean()
    return step


@job("bert_fp16_scaler", "BERT-base sequence classification (transformers), batch 32 x 256, fp16 autocast "
     "with GradScaler, AdamW")
def bert_fp16_scaler(seed):
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = BertForSequenceClassification(BertConfig(num_labels=4)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = torch.amp.GradScaler("cuda")

    def step(i):
        g = gen(seed, i)
        ids = torch.randint(0, 30522, (32, 256), device="cuda", generator=g)
        y = torch.randint(0, 4, (32,), device="cuda", generator=g)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(input_ids=ids, labels=y).loss
        return optimize(opt, loss, scaler)
    return step


@job("gpt_accum", "a compact GPT (12 layers, width 768), 4 micro-batches of 4 x 1024 accumulated per step, "
     "AdamW, bf16")
def gpt_accum(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT(12, 768, 12, 50257)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(4):
            ids = torch.randint(0, 50257, (4, 1025), device="cuda", generator=gen(seed, i * 4 + m))
            with bf16():
                loss = model(ids[:, :-1], ids[:, 1:]) / 4
            loss.backward()
            total += loss.detach()
        opt.step()
        return total
    return step


@job("moe_router", "a compact GPT (6 layers, width 768) whose feed-forward is a top-2 mixture of 8 experts: "
     "each expert's tokens change every step; batch 16 x 512, AdamW, bf16")
def moe_router(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT(6, 768, 12, 32000, ffn=2048, moe=(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(i):
        ids = torch.randint(0, 32000, (16, 513), device="cuda", generator=gen(seed, i))
        with bf16():
            loss = model(ids[:, :-1], ids[:, 1:])
        return optimize(opt, loss)
    return step


@job("lstm_lm", "a 2-layer LSTM language model (width 1024, cuDNN), batch 64, sequence 32-256 changing every "
     "step, AdamW, fp32")
def lstm_lm(seed):
    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32000, 1024)
            self.rnn = nn.LSTM(1024, 1024, num_layers=2, batch_first=True)
            self.head = nn.Linear(1024, 32000)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])
    with torch.device("cuda"):
        model = LM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g_shapes = shapes(seed)

    def step(i):
        s = pick(g_shapes, 32, 256)
        ids = torch.randint(0, 32000, (64, s + 1), device="cuda", generator=gen(seed, i))
        logits = model(ids[:, :-1])
        return optimize(opt, F.cross_entropy(logits.reshape(-1, 32000), ids[:, 1:].reshape(-1)))
    return step


@job("bert_serve", "BERT-large inference (transformers, bf16, no grad): each step serves 4 requests of batch 1-64 "
     "and sequence 32-512")
def bert_serve(seed):
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = BertModel(BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                     intermediate_size=4096)).to(torch.bfloat16).eval()
    g_shapes = shapes(seed)

    def step(i):
        out = 0.0
        for r in range(4):
            b, s = pick(g_shapes, 1, 64), pick(g_shapes, 32, 512)
            ids = torch.randint(0, 30522, (b, s), device="cuda", generator=gen(seed, i * 4 + r))
            with torch.no_grad():
                out = out + model(input_ids=ids).last_hidden_state[:, 0].float().mean()
        return out
    return step


# ---- other shapes of work ---------------------------------------------------

@job("graph_train", "a whole training step (forward, backward, capturable AdamW) of a compact GPT (6 layers, width "
     "512) captured once in a CUDA graph and replayed on new data, batch 16 x 512",
     preload_cache="PyTorch's uncached allocator (PYTORCH_NO_CUDA_MEMORY_CACHING=1) refuses to serve a CUDA-graph "
                   "capture by design, and under LD_PRELOAD the capture of this backward pass fails there; with "
                   "PyTorch's cache on, cuheap serves PyTorch's segments (the graph's private pool included)")
def graph_train(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT(6, 512, 8, 32000)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
    static = torch.zeros(16, 513, dtype=torch.long, device="cuda")

    def train():
        opt.zero_grad(set_to_none=True)
        with bf16():
            loss = model(static[:, :-1], static[:, 1:])
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):   # warm up on a side stream, as PyTorch's documentation asks
            train()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = train()

    def step(i):
        static.copy_(torch.randint(0, 32000, static.shape, device="cuda", generator=gen(seed, i)))
        graph.replay()
        return static_loss.clone()
    step.cleanup = graph.reset
    return step


@job("workspace_fraction", "a job that holds a 6 GiB preallocated workspace for its own kernels (scratch carved "
     "from it every step) under set_per_process_memory_fraction(0.35), training GPT-2 small (transformers) on "
     "batch 8 x 1024, AdamW, bf16")
def workspace_fraction(seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.cuda.set_per_process_memory_fraction(0.35)
    workspace = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(GPT2Config()).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train = lm_step(seed, model, opt, 8, 1024, 50257)

    def step(i):
        # The job's own "kernels" work in the workspace: views, never new memory.
        scratch = workspace[: (1 << 30) * (1 + i % 4)].view(torch.bfloat16)
        scratch.normal_(generator=gen(seed, 10000 + i))
        return train(i) + scratch[:1024].float().mean() * 0
    step.cleanup = lambda: torch.cuda.set_per_process_memory_fraction(1.0)
    step.keep = workspace
    return step


@job("gcn_graphs", "a 3-layer graph convolutional network (scatter-add message passing) on a new random graph "
     "every step: 100k-400k nodes, 8 edges a node, 256 features, Adam")
def gcn_graphs(seed):
    torch.manual_seed(seed)
    with torch.device("cuda"):
        layers = nn.ModuleList([nn.Linear(128, 256), nn.Linear(256, 256), nn.Linear(256, 40)])
    opt = torch.optim.Adam(layers.parameters(), lr=1e-3)
    g_shapes = shapes(seed)

    def step(i):
        g = gen(seed, i)
        n = pick(g_shapes, 100_000, 400_000, 1000)
        e = 8 * n
        src = torch.randint(0, n, (e,), device="cuda", generator=g)
        dst = torch.randint(0, n, (e,), device="cuda", generator=g)
        deg = torch.zeros(n, device="cuda").index_add_(0, dst, torch.ones(e, device="cuda")).clamp_(min=1)
        h = torch.randn(n, 128, device="cuda", generator=g)
        y = torch.randint(0, 40, (n,), device="cuda", generator=g)
        for k, lin in enumerate(layers):
            h = lin(h)
            h = torch.zeros_like(h).index_add_(0, dst, h[src]) / deg[:, None]
            if k < len(layers) - 1:
                h = F.relu(h)
        return optimize(opt, F.cross_entropy(h, y))
    return step


@job("dlrm_embeddings", "a DLRM-style recommender: 8 embedding bags of 500k x 128 (dense gradients), bottom and "
     "top MLPs, batch 2k-16k changing every step, Adagrad")
def dlrm_embeddings(seed):
    torch.manual_seed(seed)

    class DLRM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleList(nn.EmbeddingBag(500_000, 128, mode="sum") for _ in range(8))
            self.bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 128), nn.ReLU())
            self.top = nn.Sequential(nn.Linear(128 * 9 + 36, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                                     nn.Linear(512, 1))

        def forward(self, dense, bags):
            feats = [self.bottom(dense)] + [t(idx, off) for t, (idx, off) in zip(self.tables, bags)]
            z = torch.stack(feats, 1)
            inter = torch.bmm(z, z.transpose(1, 2))
            iu = torch.triu_indices(9, 9, 1, device=z.device)
            return self.top(torch.cat([z.flatten(1), inter[:, iu[0], iu[1]]], 1)).squeeze(1)
    with torch.device("cuda"):
        model = DLRM()
    opt = torch.optim.Adagrad(model.parameters(), lr=1e-2)
    g_shapes = shapes(seed)

    def step(i):
        g = gen(seed, i)
        b = pick(g_shapes, 2048, 16384, 256)
        bags = []
        for _ in range(8):
            lengths = torch.randint(1, 21, (b,), device="cuda", generator=g)
            off = torch.cat([torch.zeros(1, dtype=torch.long, device="cuda"), lengths.cumsum(0)[:-1]])
            idx = torch.randint(0, 500_000, (int(lengths.sum()),), device="cuda", generator=g)
            bags.append((idx, off))
        dense = torch.randn(b, 13, device="cuda", generator=g)
        y = torch.rand(b, device="cuda", generator=g).round()
        return optimize(opt, F.binary_cross_entropy_with_logits(model(dense, bags), y))
    return step


@job("wav2vec2_varlen", "torchaudio wav2vec 2.0 base with a CTC head, batch 8, audio of 2-12 s changing every step, "
     "AdamW, bf16")
def wav2vec2_varlen(seed):
    import torchaudio
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = torchaudio.models.wav2vec2_base(aux_num_out=32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g_shapes = shapes(seed)

    def step(i):
        g = gen(seed, i)
        samples = pick(g_shapes, 32000, 192000, 320)
        audio = torch.randn(8, samples, device="cuda", generator=g)
        with bf16():
            logits, _ = model(audio)
        frames = logits.size(1)
        targets = torch.randint(1, 32, (8, frames // 4), device="cuda", generator=g)
        loss = F.ctc_loss(logits.float().log_softmax(-1).transpose(0, 1), targets,
                          torch.full((8,), frames, dtype=torch.long), torch.full((8,), frames // 4, dtype=torch.long))
        return optimize(opt, loss)
    return step
