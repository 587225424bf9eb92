# The job's HTML report (after calibrate; also after the baseline and the emulation when the config has them).
# Its output is report()-wrapped, so `snakemake --report` links it.


def report_inputs(wildcards):
    """The calibrated timeline and summary, plus the baseline's graph and the emulation when configured."""
    inputs = [f"{JOB_DIR}/calibrated/timeline.parquet", f"{JOB_DIR}/calibrated/iterations.parquet",
              f"{JOB_DIR}/summary.txt"]
    if JOB.baseline.wanted(JOB.nproc):
        inputs.append(f"{JOB_DIR}/baseline/graph/events.parquet")
    if "emulate" in config:
        inputs.append(f"{JOB_DIR}/emulation/events.parquet")
    return inputs


rule report:
    input:
        report_inputs,
    output:
        report(f"{JOB_DIR}/report/report.html", category="prism", labels={"file": "report"}),
    params:
        job=JOB_DIR,
    log:
        f"{JOB_DIR}/logs/report.log",
    conda:
        "../../environment.yml"
    shell:
        "python -m prism.report --job {params.job:q} > {log:q} 2>&1"
