"""The ring thread's CPU per op by call (thread_time around each gloo call of `LiveRing._ring`), slice ranks at
positions 0 and 2 of a 4-ring (core 0), the server on core 1; 100 bursts. Made with:
    cd /tmp && PYTHONPATH=ROOT ROOT/.venv/bin/python prof_steps.py ROOT BYTES BURST   # ROOT: a prism checkout
(ROOT=a checkout of 8ddef5b for session 16's steps, this branch otherwise); output in prof_steps.txt."""
import sys, os, time, collections, multiprocessing as mp
ROOT = sys.argv[1]; NB = int(sys.argv[2]); BURST = int(sys.argv[3])
sys.path[:0] = [ROOT, ROOT + "/scripts"]
import replay_ring as R
acc = collections.Counter()
T = time.thread_time_ns
class WP:
    def __init__(s, w, k): s.w, s.k = w, k
    def wait(s, *a):
        t = T(); r = s.w.wait(*a); acc[s.k + " wait"] += T() - t; return r
class PGP:
    def __init__(s, pg): s.pg = pg
    def send(s, *a):
        t = T(); w = s.pg.send(*a); acc["send post"] += T() - t; return WP(w, "send")
    def recv(s, *a):
        t = T(); w = s.pg.recv(*a); acc["recv post"] += T() - t; return WP(w, "recv")
    def barrier(s): return s.pg.barrier()
def slice_main(pos, port):
    from prism.runtime.slice import ring
    orig_init = ring.LiveRing.__init__
    def init(self, *a, **k):
        orig_init(self, *a, **k); self.pg = PGP(self.pg)
    ring.LiveRing.__init__ = init
    orig = ring.LiveRing._ring
    def _ring(self, *a):
        t = T(); orig(self, *a); acc["whole _ring"] += T() - t; acc["ops"] += 1
    ring.LiveRing._ring = _ring
    R.burst_slice(port, 4, [0, 2], pos, [0], NB, BURST, 100, "float32")
    ops = acc.pop("ops")
    print(ROOT, pos, {k: round(v / ops / 1e3, 1) for k, v in acc.items()}, "us/op", flush=True)
def server_main(port):
    R.burst_server(port, 4, [0, 2], [1], NB, BURST, 100, "float32")
if __name__ == "__main__":
    port = R._free_port()
    ps = [mp.Process(target=server_main, args=(port,))] + [mp.Process(target=slice_main, args=(p, port)) for p in (0, 2)]
    for p in ps: p.start()
    for p in ps: p.join()
