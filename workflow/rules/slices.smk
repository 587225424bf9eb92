# Slice planning (a checkpoint: the number of slices is known only after it), one real run per measured
# slice with the replayed ranks answering at once (slices/) and the durations they measured. With
# `calibrate: {timed_slices: true}` every slice runs again with the replayed ranks answering at their times in a
# first calibration (slices_timed/: the slice ranks wait as in the real job); calibrate.smk says when.


checkpoint slice_plan:
    input:
        rules.graph.output,
    output:
        f"{JOB_DIR}/slices/plan.parquet",
    params:
        job=in_job(),
        devices=JOB.capture.devices,
        keep_whole=",".join(JOB.slices.keep_whole),
        plan_rule=JOB.slices.plan_rule,
    threads: stage_threads("slice_plan")
    resources:
        **rule_resources("slice_plan"),
    log:
        f"{JOB_DIR}/logs/slice_plan.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.slices.plan --job {params.job:q} --devices {params.devices} "
        "--keep-whole={params.keep_whole:q} --rule={params.plan_rule:q} >> {log:q} 2>&1"


rule slice_run:  # runs alone: its timings must not share the machine with another stage
    input:
        plan=f"{JOB_DIR}/slices/plan.parquet",
        raw=rules.capture.output.raw,
        payloads=rules.capture.output.payloads,
    output:
        f"{JOB_DIR}/slices/slice={{k}}/events.parquet",
        f"{JOB_DIR}/slices/slice={{k}}/replay_ops.parquet",
    params:
        job=in_job(),
        section=section("capture"),
    threads: stage_threads("slice_run")
    resources:
        **rule_resources("slice_run"),
    log:
        f"{JOB_DIR}/logs/slice_run_{{k}}.log",
    conda:
        "../envs/runtime.yaml"
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
        job=in_job(),
    threads: stage_threads("slice_durations")
    resources:
        **rule_resources("slice_durations"),
    log:
        f"{JOB_DIR}/logs/slice_durations.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.calibrate.from_slices --job {params.job:q} >> {log:q} 2>&1"


rule slice_run_timed:  # runs alone, like slice_run
    input:
        plan=f"{JOB_DIR}/slices/plan.parquet",
        raw=rules.capture.output.raw,
        payloads=rules.capture.output.payloads,
        timeline=f"{JOB_DIR}/calibrated_untimed/timeline.parquet",
    output:
        f"{JOB_DIR}/slices_timed/slice={{k}}/events.parquet",
        f"{JOB_DIR}/slices_timed/slice={{k}}/replay.parquet",
        f"{JOB_DIR}/slices_timed/slice={{k}}/replay_ops.parquet",
    params:
        job=in_job(),
        section=section("capture"),
    threads: stage_threads("slice_run")
    resources:
        **rule_resources("slice_run"),
    log:
        f"{JOB_DIR}/logs/slice_run_timed_{{k}}.log",
    conda:
        "../envs/runtime.yaml"
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
        job=in_job(),
    threads: stage_threads("slice_durations")
    resources:
        **rule_resources("slice_durations"),
    log:
        f"{JOB_DIR}/logs/slice_durations_timed.log",
    conda:
        "../envs/analysis.yaml"
    shell:
        "$PY -m prism.calibrate.from_slices --job {params.job:q} --slices slices_timed >> {log:q} 2>&1"
