#!/usr/bin/env python3
"""Instructions per run of `sonde bench`, by phase, from two callgrind runs.

    scripts/callgrind-phases.py NAME,BIG.cg,RUNS_BIG,SMALL.cg,RUNS_SMALL [...]

Each argument is one case: two callgrind profiles of the same bench with
different run counts (warm-up included). The per-run figure is their
difference divided by the difference in runs, so start-up and plugin load
cancel out. Each function's self cost goes to the first phase whose pattern
matches its name (callgrind's inclusive costs do not survive wasmtime's
fiber switches). Prints a Markdown table, one column per case
(BENCHMARKS.md, "Where one run's CPU goes").
"""
import collections
import re
import subprocess
import sys
cats = [
 ("guest code (the plugin's wasm)", r"^0x[0-9a-f]+$"),
 ("load (once per process; cancels out)", r"sha2::|compress256|\$a|\$b|\$c|\[a\[0\]"),
 ("WASI context set-up (rand seeding, clocks)", r"wasmtime_wasi::ctx|rand::|rand_core|rand_chacha|chacha|WasiRandomCtx|WasiClocks|wasmtime_wasi::random|wasmtime_wasi::clocks"),
 ("store + call state set-up", r"Store<T>::new|StoreOpaque::new|StoreInner<.*>::new|CallState::new|new_store|ResourceTable::new|WasiHttpCtx|CallGrants::new|NetPattern::for_target|MemoryCap|CallBounds"),
 ("instantiation (funcs, imports, instance slots)", r"instantiat|Instance::new|initialize|allocate_instance|component::instance|lookup_vmdef|store_invariant_func|OwnedImports|InstanceAllocator>::allocate|::alloc$|new_module_instance|vmctx|VMComponentContext|ModuleRegistry|register|cranelift_bforest|FuncKey|func_loc|trampoline_ptrs|EngineCode|get_func_ref|get_export|ref_func|Instantiator|PrimaryMap|typecheck|MemoryPool::allocate|TablePool::allocate|StackPool::allocate|index_allocator|PluginPre|Plugin::new|Indices"),
 ("memory reset on drop (PAGEMAP_SCAN + memset)", r"pagemap|cow::|memset"),
 ("instance dealloc + store drop", r"deallocate|merge_or_flush|decommit|drop_in_place<wasmtime|StoreOpaque as core::ops::drop|drop_in_place<sonde_sandbox::engine::store|free_many|free_locked|DecommitQueue"),
 ("fiber switches (async wasm calls)", r"fiber|Fiber"),
 ("component calls: lift/lower, realloc, host-call trampolines", r"component::func|typed::|Lower|Lift[^a-z]|lower|::lift|trampoline|array_call|ResourceTable|wasm_to_host|HostFunc|func::Func|Caller|component::resources|canonical|ValRaw|catch_traps|traphandlers|call_unchecked|HostFn|LowerContext|LiftContext|options_memory|realloc_|Resource<|WasmList|WasmStr|from_utf8|bindings::sonde"),
 ("host capability (grant check, dial, hyper, pool)", r"sonde_sandbox::host|sonde_policy::|hyper::|^http::|<http::|rustls|dial|h1::|HeaderMap|HeaderName|httparse|bytes::|want::|try_lock|Pool"),
 ("tokio, std time/net (scheduler, timers, I/O)", r"tokio::|mio::|std::io|std::net|std::sys|socket|epoll|Timespec|Instant|parking_lot|core::net"),
 ("malloc/free/memcpy", r"malloc|free|realloc|memcpy|memmove|calloc|cfree|tcache|_int_|__rdl_|__rustc::|finish_grow|RawVec|memcmp|strlen"),
 ("result: lifting the outcome, plugin_text, RunResult", r"from_outcome|plugin_text|verdict::|RunResult|truncate"),
 ("sonde engine + bench loop", r"sonde_sandbox|sonde_core|sonde::"),
]
def selfcost(path):
    out = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", path], capture_output=True, text=True).stdout
    fn = collections.Counter()
    for l in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)$", l)
        if not m or "PROGRAM TOTALS" in l: continue
        rest = re.sub(r" \[[^\]]*\]$", "", m.group(2))
        fm = re.match(r"^(.*?\.(?:rs|c|h|S)|\?\?\?|[^:]*\.[a-z]+):(.*)$", rest)
        fn[(fm.group(2) if fm else rest).strip()] += int(m.group(1).replace(",", ""))
    tot = int(re.search(r"([\d,]+)\s+\(100.0%\)\s+PROGRAM TOTALS", out).group(1).replace(",", ""))
    return fn, tot
def per_run(big, rb, small, rs):
    fb, tb = selfcost(big); fs, ts = selfcost(small)
    per = (tb - ts) / (rb - rs)
    cs = collections.Counter(); top = collections.defaultdict(list)
    for name in set(fb) | set(fs):
        d = (fb.get(name, 0) - fs.get(name, 0)) / (rb - rs)
        for label, pat in cats:
            if re.search(pat, name): cs[label] += d; top[label].append((d, name)); break
        else: cs["other"] += d; top["other"].append((d, name))
    return per, cs, top
cols = []
for spec in sys.argv[1:]:
    name, big, rb, small, rs = spec.split(",")
    cols.append((name,) + per_run(big, int(rb), small, int(rs)))
print("| phase | " + " | ".join(c[0] for c in cols) + " |")
print("| --- |" + " ---: |" * len(cols))
for label, _ in cats + [("other", "")]:
    if label.startswith("load"): continue
    print(f"| {label} | " + " | ".join(f"{c[2][label]:,.0f} ({100*c[2][label]/c[1]:.0f} %)" for c in cols) + " |")
print("| **whole run** | " + " | ".join(f"**{c[1]:,.0f}**" for c in cols) + " |")
for c in cols:
    print(f"\n{c[0]}, largest in 'other':", "; ".join(f"{n[:50]} {v:,.0f}" for v, n in sorted(c[3]["other"], reverse=True)[:8]))
