"""The job's report (one self-contained HTML page of plots) and its trace exports (Perfetto, Kineto/HTA).

- `data`: a job's timelines in one table shape and the figures computed from them;
- `critical`: the critical path of an iteration (the walk is `prism.calibrate.critical_path`);
- `plots`: the plotly figures; `html`: the page; `export`: Chrome/Perfetto and Kineto trace JSON;
- `stage`: ``python -m prism.report --job DIR`` (``prism report``).
"""
