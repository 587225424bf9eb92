"""What a global module forward hook pair costs a module call (the microbatch markers: prism/runtime/markers.py),
plain and wrapped in torch.compiler.disable as markers.py does. Run: .venv/bin/python scripts/hook_cost.py"""
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
