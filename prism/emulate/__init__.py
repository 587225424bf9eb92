"""The emulate stage (`prism emulate`): sandbox ranks run the real program inside the replayed job.

`sandbox` resolves ``--sandbox SPEC``, `inputs` checks the job folder and reads its program, `stage` runs
``prism launch --mode emulate`` and publishes ``emulation/``, `outputs` builds its tables.
"""
