/* test_device_fault.c - tests of the fault plans (src/device_fault.c): a
 * wrapped simulated device fails exactly the calls its plan names, with the
 * status and a message that names the call, does nothing beneath for a failed
 * call, passes every other call and the inner device's own errors through,
 * repeats a seeded random plan, and after a sticky error fails everything.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common.h"
#include "device.h"
#include "test_util.h"

#include <string.h>

static cuh_device_t *make(cuh_device_t **sim)
{
    *sim = cuh_sim_create(&(cuh_sim_params_t){.capacity = 64 * CUH_MiB, .ordinal = 0});
    assert_non_null(*sim);
    cuh_device_t *dev = cuh_fault_wrap(*sim);
    assert_non_null(dev);
    assert_ptr_equal(cuh_fault_inner(dev), *sim);
    return dev;
}

static void test_nth_call_fails_once_and_does_nothing_beneath(void **state)
{
    (void)state;
    cuh_device_t *sim, *dev = make(&sim);
    cuh_fault_nth(dev, CUH_FAULT_MEM_ALLOC, 2, CUH_DEV_ERROR);
    uintptr_t a = 0, b = 0, c = 0;
    assert_int_equal(dev->ops->mem_alloc(dev, 2 * CUH_MiB, &a), CUH_DEV_OK);
    assert_int_equal(dev->ops->mem_alloc(dev, 2 * CUH_MiB, &b), CUH_DEV_ERROR);
    assert_non_null(strstr(cuh_dev_error_text(dev), "mem_alloc failed: injected fault (call 2 of its kind)"));
    cuh_sim_counters_t k;
    cuh_sim_counters(sim, &k);
    assert_int_equal(k.mem_allocs, 1);   /* the failed call never reached the device */
    assert_int_equal(dev->ops->mem_alloc(dev, 2 * CUH_MiB, &c), CUH_DEV_OK);
    assert_int_equal(cuh_fault_injected(dev, CUH_FAULT_MEM_ALLOC), 1);
    assert_int_equal(cuh_fault_injected(dev, CUH_FAULT_MEM_FREE), 0);
    /* An out-of-memory of the device beneath comes through as itself. */
    uintptr_t big;
    assert_int_equal(dev->ops->mem_alloc(dev, 128 * CUH_MiB, &big), CUH_DEV_OOM);
    assert_int_equal(dev->ops->mem_free(dev, a, 2 * CUH_MiB), CUH_DEV_OK);
    assert_int_equal(dev->ops->mem_free(dev, c, 2 * CUH_MiB), CUH_DEV_OK);
    dev->ops->destroy(dev);   /* destroys the simulated device too (ASan would see a leak) */
}

/* A stuck range: every unmap of it fails, whatever else the plan says,
 * and nothing happens beneath; other ranges unmap; clearing lets it go. */
static void test_a_stuck_range_refuses_every_unmap_until_cleared(void **state)
{
    (void)state;
    cuh_device_t *sim, *dev = make(&sim);
    uint64_t h = 0, g = 0;
    uintptr_t va = 0;
    assert_int_equal(dev->ops->vm_reserve(dev, 16 * CUH_MiB, &va), CUH_DEV_OK);
    assert_int_equal(dev->ops->vm_create(dev, 2 * CUH_MiB, &h), CUH_DEV_OK);
    assert_int_equal(dev->ops->vm_create(dev, 2 * CUH_MiB, &g), CUH_DEV_OK);
    assert_int_equal(dev->ops->vm_map(dev, va, 2 * CUH_MiB, h), CUH_DEV_OK);
    assert_int_equal(dev->ops->vm_map(dev, va + 2 * CUH_MiB, 2 * CUH_MiB, g), CUH_DEV_OK);
    cuh_fault_unmap_stuck(dev, va);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dev->ops->vm_unmap(dev, va, 2 * CUH_MiB), CUH_DEV_ERROR);
        assert_non_null(strstr(cuh_dev_error_text(dev), "vm_unmap failed: injected fault"));
    }
    assert_int_equal(cuh_sim_handle_at(sim, va, NULL), h);   /* nothing happened beneath */
    assert_int_equal(cuh_fault_injected(dev, CUH_FAULT_VM_UNMAP), 3);
    assert_int_equal(dev->ops->vm_unmap(dev, va + 2 * CUH_MiB, 2 * CUH_MiB), CUH_DEV_OK);
    cuh_fault_clear(dev);
    assert_int_equal(dev->ops->vm_unmap(dev, va, 2 * CUH_MiB), CUH_DEV_OK);
    dev->ops->vm_release(dev, h);
    dev->ops->vm_release(dev, g);
    dev->ops->vm_unreserve(dev, va, 16 * CUH_MiB);
    dev->ops->destroy(dev);
}

static void test_the_plan_counts_from_when_it_is_set(void **state)
{
    (void)state;
    cuh_device_t *sim, *dev = make(&sim);
    cuh_event_t ev;
    assert_int_equal(dev->ops->event_create(dev, &ev), CUH_DEV_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dev->ops->event_record(dev, ev, 0), CUH_DEV_OK);
    cuh_fault_nth(dev, CUH_FAULT_EVENT_RECORD, 1, CUH_DEV_ERROR);   /* the next one */
    assert_int_equal(dev->ops->event_record(dev, ev, 0), CUH_DEV_ERROR);
    assert_non_null(strstr(cuh_dev_error_text(dev), "event_record failed: injected fault (call 4 of its kind)"));
    assert_int_equal(dev->ops->event_record(dev, ev, 0), CUH_DEV_OK);
    cuh_fault_nth(dev, CUH_FAULT_EVENT_QUERY, 1, CUH_DEV_ERROR);
    cuh_fault_nth(dev, CUH_FAULT_EVENT_QUERY, 0, CUH_DEV_ERROR);     /* cancelled */
    assert_int_equal(dev->ops->event_query(dev, ev), CUH_DEV_OK);
    dev->ops->event_destroy(dev, ev);
    dev->ops->destroy(dev);
}

static void test_random_plan_repeats_with_its_seed(void **state)
{
    (void)state;
    int fails[2] = {0, 0};
    char pattern[2][201];
    for (int run = 0; run < 2; run++) {
        cuh_device_t *sim, *dev = make(&sim);
        cuh_fault_random(dev, CUH_FAULT_SYNCHRONIZE, 0.25, 42, CUH_DEV_ERROR);
        for (int i = 0; i < 200; i++) {
            int failed = dev->ops->synchronize(dev) != CUH_DEV_OK;
            pattern[run][i] = failed ? 'x' : '.';
            fails[run] += failed;
        }
        pattern[run][200] = '\0';
        assert_int_equal(cuh_fault_injected(dev, CUH_FAULT_SYNCHRONIZE), (uint64_t)fails[run]);
        dev->ops->destroy(dev);
    }
    assert_string_equal(pattern[0], pattern[1]);
    assert_in_range(fails[0], 25, 75);   /* about a quarter of 200 */
}

static void test_sticky_error_fails_every_call_from_then_on(void **state)
{
    (void)state;
    cuh_device_t *sim, *dev = make(&sim);
    cuh_fault_sticky(dev, 3, CUH_DEV_ERROR);
    uintptr_t a;
    cuh_event_t ev;
    assert_int_equal(dev->ops->mem_alloc(dev, 2 * CUH_MiB, &a), CUH_DEV_OK);   /* call 1 */
    assert_int_equal(dev->ops->event_create(dev, &ev), CUH_DEV_OK);           /* call 2 */
    assert_false(cuh_fault_is_sticky(dev));
    assert_int_equal(dev->ops->event_record(dev, ev, 0), CUH_DEV_ERROR);      /* call 3: struck */
    assert_true(cuh_fault_is_sticky(dev));
    assert_non_null(strstr(cuh_dev_error_text(dev), "event_record failed: injected sticky error"));
    assert_int_equal(dev->ops->mem_free(dev, a, 2 * CUH_MiB), CUH_DEV_ERROR);
    assert_non_null(strstr(cuh_dev_error_text(dev), "mem_free failed"));
    size_t f, t;
    assert_int_equal(dev->ops->mem_info(dev, &f, &t), CUH_DEV_ERROR);
    cuh_fault_clear(dev);   /* a test's cleanup: everything goes back */
    assert_false(cuh_fault_is_sticky(dev));
    assert_int_equal(dev->ops->mem_free(dev, a, 2 * CUH_MiB), CUH_DEV_OK);
    dev->ops->event_destroy(dev, ev);
    cuh_sim_counters_t k;
    cuh_sim_counters(sim, &k);
    assert_int_equal(k.used, 0);
    assert_int_equal(k.live_events, 0);
    dev->ops->destroy(dev);
}

static void test_inner_errors_and_names_come_through(void **state)
{
    (void)state;
    cuh_device_t *sim, *dev = make(&sim);
    cuh_sim_device_fences(sim, 0);
    cuh_event_t ev;
    assert_int_equal(dev->ops->event_create(dev, &ev), CUH_DEV_OK);
    assert_int_equal(dev->ops->event_record_all(dev, ev), CUH_DEV_UNSUPPORTED);
    assert_non_null(strstr(cuh_dev_error_text(dev), "no device-wide fences"));
    dev->ops->event_destroy(dev, ev);
    assert_int_equal(dev->ops->vm_granularity(dev), sim->ops->vm_granularity(sim));
    for (int k = 0; k < CUH_FAULT_NUM_CALLS; k++)
        assert_int_equal(cuh_fault_call_by_name(cuh_fault_call_name((cuh_fault_call_t)k)), k);
    assert_int_equal(cuh_fault_call_by_name("cuMemMap"), -1);
    assert_string_equal(cuh_fault_call_name(CUH_FAULT_VM_MAP), "vm_map");
    dev->ops->destroy(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nth_call_fails_once_and_does_nothing_beneath),
        cmocka_unit_test(test_a_stuck_range_refuses_every_unmap_until_cleared),
        cmocka_unit_test(test_the_plan_counts_from_when_it_is_set),
        cmocka_unit_test(test_random_plan_repeats_with_its_seed),
        cmocka_unit_test(test_sticky_error_fails_every_call_from_then_on),
        cmocka_unit_test(test_inner_errors_and_names_come_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
