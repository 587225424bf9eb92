"""What a global module forward hook pair costs a module call (the microbatch markers: prism/runtime/markers.py),
plain and wrapped in torch.compiler.disable; then the wrapper alone and prism's installed pair (markers.install), called
directly. Run: .venv/bin/python scripts/hook_cost.py"""
import time, torch, threading
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
m = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(200)])
x = torch.randn(2, 8)
_state = threading.local()
def run(label):
    for _ in range(3): m(x)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20): m(x)
        best = min(best, (time.perf_counter() - t) / (20 * 201))
    print(f"{label:28s} {best*1e6:7.2f} us per module call")
    return best
base = run("no hooks")
def pre(mod, args):
    if torch._C._current_graph_task_id() != -1: return
    _state.depth = getattr(_state, "depth", 0) + 1
def post(mod, args, out):
    if torch._C._current_graph_task_id() != -1: return
    _state.depth = getattr(_state, "depth", 0) - 1
h = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
plain = run("plain hooks")
for x_ in h: x_.remove()
h = [register_module_forward_pre_hook(torch.compiler.disable(pre)), register_module_forward_hook(torch.compiler.disable(post))]
dis = run("compiler.disable hooks")
for x_ in h: x_.remove()
print(f"hook cost per module call: plain {(plain-base)*1e6:.2f} us, disabled {(dis-base)*1e6:.2f} us")
# Without the module call's noise: the calls themselves, best of 5 x 20000 (the wrapper's cost a call, and prism's
# installed pair on a module nested in a microbatch, the path of all but one module of a forward)
from torch.nn.modules import module as _m
from prism.runtime import markers
def best_us(fn, n=20000):
    out = 1e9
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(n): fn()
        out = min(out, (time.perf_counter_ns() - t) / n / 1e3)
    return out
noop = lambda mod, args: None
hidden = torch.compiler.disable(noop)
lin, root = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
wrapper = best_us(lambda: hidden(lin, ())) - best_us(lambda: noop(lin, ()))
h = markers.install(None)  # no recorder: the hooks without a trace
mpre, mpost = list(_m._global_forward_pre_hooks.values())[-1], list(_m._global_forward_hooks.values())[-1]
mpre(root, ())  # depth 0 -> 1: the microbatch's root
pair = best_us(lambda: (mpre(lin, ()), mpost(lin, (), None)))
mpost(root, (), torch.zeros(1))
for x_ in h: x_.remove()
print(f"torch.compiler.disable wrapper: +{wrapper:.2f} us a call; prism's hook pair on a nested module: {pair:.2f} us")
