# The calibrated global timeline (calibrated/) from the slices' measured durations. With
# `calibrate: {timed_slices: true}`, the calibration is iterated once: a first calibration (calibrated_untimed/),
# every slice again timed by it (slices.smk: slices_timed/), and calibrated/ from those durations. Off by default:
# on the W=8 matrix it measured no better than one pass (docs/fidelity.md).

SLICE_PASS = "slices_timed" if JOB.calibrate.timed_slices else "slices"  # the pass calibrated/ comes from


rule calibrate_untimed:  # the first pass: times the second pass's replayed ranks
    input:
        rules.graph.output,
        durations=f"{JOB_DIR}/slices/durations.parquet",
        transfers=f"{JOB_DIR}/slices/transfers.parquet",
    output:
        f"{JOB_DIR}/calibrated_untimed/timeline.parquet",
        f"{JOB_DIR}/calibrated_untimed/iterations.parquet",
        f"{JOB_DIR}/calibrated_untimed/critical_path.parquet",
    params:
        job=in_job(),
        out=in_job("calibrated_untimed"),
    threads: stage_threads("calibrate")
    resources:
        **rule_resources("calibrate"),
    log:
        f"{JOB_DIR}/logs/calibrate_untimed.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.calibrate --job {params.job:q} --durations {input.durations:q} "
        "--transfers {input.transfers:q} --out {params.out:q} >> {log:q} 2>&1"


rule calibrate:
    input:
        rules.graph.output,
        durations=f"{JOB_DIR}/{SLICE_PASS}/durations.parquet",
        transfers=f"{JOB_DIR}/{SLICE_PASS}/transfers.parquet",
    output:
        f"{JOB_DIR}/calibrated/timeline.parquet",
        f"{JOB_DIR}/calibrated/iterations.parquet",
        f"{JOB_DIR}/calibrated/critical_path.parquet",
    params:
        job=in_job(),
    threads: stage_threads("calibrate")
    resources:
        **rule_resources("calibrate"),
    log:
        f"{JOB_DIR}/logs/calibrate.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.calibrate --job {params.job:q} --durations {input.durations:q} "
        "--transfers {input.transfers:q} >> {log:q} 2>&1"
