# Slice planning (a checkpoint: the number of slices is known only after it), one real run per measured
# slice with the replayed ranks answering at once (slices/), the durations they measured and the calibrated
# global timeline (calibrated/). With `calibrate: {timed_slices: true}`, the calibration is iterated once: a
# first calibration (calibrated_untimed/), every slice again with the replayed ranks answering at their times
# in it (slices_timed/: the slice ranks wait as in the real job), the durations they measured, and calibrated/
# from those. Off by default: on the W=8 matrix it measured no better than one pass (docs/fidelity.md).

SLICE_PASS = "slices_timed" if JOB.calibrate.timed_slices else "slices"  # the pass calibrated/ comes from


checkpoint slice_plan:
    input:
        rules.graph.output,
    output:
        f"{JOB_DIR}/slices/plan.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
        devices=JOB.capture.devices,
    threads: stage_threads("slice_plan")
    resources:
        **rule_resources("slice_plan"),
    log:
        f"{JOB_DIR}/logs/slice_plan.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.slices.plan --job {params.job:q} --devices {params.devices} >> {log:q} 2>&1"


rule slice_run:  # runs alone: its timings must not share the machine with another stage
    input:
        plan=f"{JOB_DIR}/slices/plan.parquet",
        raw=rules.capture.output.raw,
        payloads=rules.capture.output.payloads,
    output:
        f"{JOB_DIR}/slices/slice={{k}}/events.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(os.path.dirname(output[0]))),
        section=section("capture"),
    threads: stage_threads("slice_run")
    resources:
        **rule_resources("slice_run"),
    log:
        f"{JOB_DIR}/logs/slice_run_{{k}}.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.slices.run --job {params.job:q} --slice {wildcards.k} --config-json {params.section:q} "
        ">> {log:q} 2>&1"


rule slice_durations:
    input:
        measured_slices,
    output:
        f"{JOB_DIR}/slices/durations.parquet",
        f"{JOB_DIR}/slices/transfers.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    threads: stage_threads("slice_durations")
    resources:
        **rule_resources("slice_durations"),
    log:
        f"{JOB_DIR}/logs/slice_durations.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.calibrate.from_slices --job {params.job:q} >> {log:q} 2>&1"


rule calibrate_untimed:  # the first pass: times the second pass's replayed ranks
    input:
        rules.graph.output,
        durations=f"{JOB_DIR}/slices/durations.parquet",
        transfers=f"{JOB_DIR}/slices/transfers.parquet",
    output:
        f"{JOB_DIR}/calibrated_untimed/timeline.parquet",
        f"{JOB_DIR}/calibrated_untimed/iterations.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
        out=lambda w, output: os.path.dirname(output[0]),
    threads: stage_threads("calibrate")
    resources:
        **rule_resources("calibrate"),
    log:
        f"{JOB_DIR}/logs/calibrate_untimed.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.calibrate --job {params.job:q} --durations {input.durations:q} "
        "--transfers {input.transfers:q} --out {params.out:q} >> {log:q} 2>&1"


rule slice_run_timed:  # runs alone, like slice_run
    input:
        plan=f"{JOB_DIR}/slices/plan.parquet",
        raw=rules.capture.output.raw,
        payloads=rules.capture.output.payloads,
        timeline=f"{JOB_DIR}/calibrated_untimed/timeline.parquet",
    output:
        f"{JOB_DIR}/slices_timed/slice={{k}}/events.parquet",
        f"{JOB_DIR}/slices_timed/slice={{k}}/replay.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(os.path.dirname(output[0]))),
        section=section("capture"),
    threads: stage_threads("slice_run")
    resources:
        **rule_resources("slice_run"),
    log:
        f"{JOB_DIR}/logs/slice_run_timed_{{k}}.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.slices.run --job {params.job:q} --slice {wildcards.k} --config-json {params.section:q} "
        "--timed-by {input.timeline:q} >> {log:q} 2>&1"


rule slice_durations_timed:
    input:
        lambda w: measured_slices(w, "slices_timed"),
    output:
        f"{JOB_DIR}/slices_timed/durations.parquet",
        f"{JOB_DIR}/slices_timed/transfers.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    threads: stage_threads("slice_durations")
    resources:
        **rule_resources("slice_durations"),
    log:
        f"{JOB_DIR}/logs/slice_durations_timed.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.calibrate.from_slices --job {params.job:q} --slices slices_timed >> {log:q} 2>&1"


rule calibrate:
    input:
        rules.graph.output,
        durations=f"{JOB_DIR}/{SLICE_PASS}/durations.parquet",
        transfers=f"{JOB_DIR}/{SLICE_PASS}/transfers.parquet",
    output:
        f"{JOB_DIR}/calibrated/timeline.parquet",
        f"{JOB_DIR}/calibrated/iterations.parquet",
    params:
        job=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    threads: stage_threads("calibrate")
    resources:
        **rule_resources("calibrate"),
    log:
        f"{JOB_DIR}/logs/calibrate.log",
    conda:
        "../../environment.yml"
    shell:
        "$PY -m prism.calibrate --job {params.job:q} --durations {input.durations:q} "
        "--transfers {input.transfers:q} >> {log:q} 2>&1"
