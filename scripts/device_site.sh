# Sourced by the device scripts: install the packages the accelerator host lacks into /tmp/site and put it
# (and this tree) on PYTHONPATH.   install_site PKGS [PYTHON]
# PKGS: wheels (*.whl) and/or unpacked wheels packed as *.tar.xz (e.g. gpu_stage/s5fid/.pkgs).
install_site() {
    local pkgs=$1 py=${2:-python3}
    mkdir -p /tmp/site
    if compgen -G "$pkgs/*.whl" > /dev/null; then
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$pkgs"/*.whl || return
    fi
    for t in "$pkgs"/*.tar.xz; do [ -e "$t" ] && { tar -xJf "$t" -C /tmp/site || return; }; done
    export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES= PYTHONUNBUFFERED=1
}

# install_site, then the open-file limit raised to the hard one (capture: a pipe pair and a socket a rank).
#   prepare_host SCRIPT_NAME PKGS [PYTHON]
prepare_host() {
    install_site "$2" "${3:-python3}" || { echo "$1: installing the wheels of $2 failed"; return 2; }
    ulimit -Hn 65536 2>/dev/null
    ulimit -n "$(ulimit -Hn)"
}

# One-GPU calls (scripts/overhead_profile.sh, overhead_levels.sh): prism's wheels from PKGS (default .whl) when
# that folder exists, else prism's deps must be importable already (a CPU check here); then the GPU shown again
# (install_site hides it) and NVLink multicast left off.   gpu_host SCRIPT_NAME PYTHON LOG [DEVICE]
gpu_host() {
    if [ -d "${PKGS:-.whl}" ]; then
        prepare_host "$1" "${PKGS:-.whl}" "$2" > "$3" 2>&1 || { cat "$3"; return 2; }
    else
        export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
        echo "no wheel folder ${PKGS:-.whl}: prism's deps must be importable already" > "$3"
    fi
    [ "${4:-cuda}" = cuda ] && export CUDA_VISIBLE_DEVICES=${GPU:-0}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    return 0
}

# A time-boxed step of a device script:   stage NAME NEEDED_S COMMAND...
# (the caller sets total, begin, log, work) runs COMMAND when NEEDED_S of the call's total are left, stopped
# STAGE_SLACK s (default 5) before its end; its output goes to $work/NAME.log, each line stamped with unix time
# when STAGE_STAMP is set (to join with a sampler's rows); its start and exit are appended to $log.
stage() {
    local name=$1 need=$2 l rc
    shift 2
    l=$((total - ($(date +%s) - begin)))
    if [ "$l" -lt "$need" ]; then
        echo "$name: not started: ${l} s left of ${total} s (needs ${need})" | tee -a "$log"
        return
    fi
    echo "$name: started at $(($(date +%s) - begin)) s${STAGE_STAMP:+ (unix $(date +%s))}" | tee -a "$log"
    timeout -s TERM -k 5 "$((l - ${STAGE_SLACK:-5}))" "$@" 2>&1 | if [ -n "${STAGE_STAMP:-}" ]; then
        while IFS= read -r line; do printf '%(%s)T %s\n' -1 "$line"; done; else cat; fi > "$work/$name.log"
    rc=${PIPESTATUS[0]}
    echo "$name: exit $rc at $(($(date +%s) - begin)) s${STAGE_STAMP:+ (unix $(date +%s))}" | tee -a "$log"
}

# The overhead calls' GPU-bound workload (session 15: ~40 TFLOP of fp32 matmuls a step, experts 2 of 4 a token,
# 8192 tokens a microbatch; ~1 s of GPU a step against ~0.1 s of CPU issuing it).
GPU_BOUND_WORKLOAD="--microbatches 2 --micro-batch-size 8 --seq-len 1024 --hidden 2048 --ffn-hidden 8192 --layers 4 --heads 16 --kv-heads 8 --vocab 32000"

# The samplers of the overhead calls, in the background while the benches run: scripts/host_sampler.py (every
# 0.5 s: the cores' clock, busy, irq and steal shares, $work/samples.tsv) and on CUDA nvidia-smi (SM/memory
# clock, power, utilisation: $work/gpu.csv).   start_samplers PYTHON CORES DEVICE   (the caller sets work, total)
# ... stop_samplers
start_samplers() {
    $1 scripts/host_sampler.py "$work/samples.tsv" "$2" 0.5 "$total" &
    sampler=$!
    gpu_sampler=
    if [ "$3" = cuda ] && command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,pstate --format=csv,noheader \
            -lms 500 > "$work/gpu.csv" 2>&1 &
        gpu_sampler=$!
    fi
}
stop_samplers() {
    kill "$sampler" ${gpu_sampler:+"$gpu_sampler"} 2>/dev/null
    wait "$sampler" 2>/dev/null
}
