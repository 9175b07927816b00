# shellcheck shell=bash
# Preemption-safe job steps for sbatch scripts. Source it, then run the step through `run_requeueable`:
#
#   source "${VITLARGE_ROOT:-$SLURM_SUBMIT_DIR}/scripts/slurm/requeue.sh"
#   run_requeueable srun python train.py --config recipes/vit_b16.py --workdir runs/vit_b16 "$@"
#
# What happens when Slurm wants the job to stop:
# * `#SBATCH --signal=B:USR1@120` sends USR1 to this batch shell (B: only the shell) two minutes
#   before the time limit; preemption and `scancel` send TERM to the shell and to every task.
# * The trap forwards USR1 to srun, which forwards it to every task. Not TERM: srun answers a TERM by
#   killing its tasks (SIGKILL), which would lose the step in progress.
# * train.py finishes the current optimizer step (a signal on any rank stops all ranks at the same
#   step), writes a checkpoint and exits 75.
# * On exit status 75 this shell runs `scontrol requeue $SLURM_JOB_ID`: the job goes back to the
#   queue with the same id, script and arguments, and train.py resumes from the newest checkpoint
#   in --workdir. Slurm sets SLURM_RESTART_COUNT in the requeued job; use `--open-mode=append` so
#   the log keeps every run.
# A bash `wait` returns early when a trapped signal arrives, so we wait again until srun has exited.
#
# Losing a node: submitted with a node range (`sbatch --nodes=2-4 ...`), a job whose node fails is
# requeued by Slurm (--requeue, JobRequeue=1) and starts again on the nodes it gets, down to MIN.
# The job asks for whole nodes and no task count: a requeued job keeps the task count of its first
# allocation (`--ntasks-per-node` to sbatch would pin it to MAX nodes' worth and the job would wait
# for the lost node). The step asks for its tasks itself, `srun_step PER_NODE`: PER_NODE tasks on
# every node the job holds now. train.py then resumes at the new world size: same global batch,
# accumulation re-derived, one line saying so.

_vitlarge_log() { echo "vitlarge[slurm] $(date '+%F %T') job ${SLURM_JOB_ID:-?}: $*" >&2; }

_vitlarge_forward() {  # _vitlarge_forward SIGNAL PID
  _vitlarge_log "got SIG$1: asking the step to checkpoint and stop (SIGUSR1 to srun $2)"
  kill -USR1 "$2" 2>/dev/null || true
}

# srun_step PER_NODE COMMAND...: `srun` of PER_NODE tasks on each node this run of the job holds. The
# counts are explicit because srun reads SLURM_NTASKS and SLURM_NNODES as its -n and -N, and in a
# requeued job they describe the first allocation; --cpus-per-task is repeated because srun does not
# inherit it from sbatch (Slurm >= 22.05). exec: run_requeueable's $! is srun itself.
# With VITLARGE_WORLD_DIVIDES=M set (the recipe's global batch / micro batch, 128 for vit_b16), the
# step uses the most nodes N it holds for which N x PER_NODE divides M, and says so when that is fewer.
srun_step() {
  local per_node=$1 held=${SLURM_JOB_NUM_NODES:?srun_step runs inside a Slurm job} nodes
  shift
  if ! [[ $per_node =~ ^[1-9][0-9]*$ ]]; then
    _vitlarge_log "srun_step: tasks per node must be a positive number, got '$per_node' (pass --gpus-per-node or --ntasks-per-node to sbatch)"
    exit 2
  fi
  nodes=$held
  if [[ -n ${VITLARGE_WORLD_DIVIDES:-} ]]; then
    while ((nodes > 0 && VITLARGE_WORLD_DIVIDES % (nodes * per_node) != 0)); do nodes=$((nodes - 1)); done
    if ((nodes == 0)); then
      nodes=$held
      _vitlarge_log "no count of up to $held nodes x $per_node tasks divides VITLARGE_WORLD_DIVIDES=$VITLARGE_WORLD_DIVIDES; starting all $held (train.py will say what divides)"
    elif ((nodes < held)); then
      _vitlarge_log "using $nodes of the $held nodes held: $((nodes * per_node)) tasks divide VITLARGE_WORLD_DIVIDES=$VITLARGE_WORLD_DIVIDES, $((held * per_node)) do not"
    fi
  fi
  exec srun --nodes="$nodes" --ntasks=$((nodes * per_node)) --ntasks-per-node="$per_node" \
    ${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"} "$@"
}

# _vitlarge_node_lost: whether a node of this job is down, drained, failing or not responding (Slurm marks
# a silent node with "*" before SlurmdTimeout makes it DOWN); polled for VITLARGE_NODE_LOSS_WAIT seconds
# (120). A step that failed for it is requeued: the job continues on the nodes it gets.
_vitlarge_node_lost() {
  local deadline=$((SECONDS + ${VITLARGE_NODE_LOSS_WAIT:-120})) states
  while :; do
    states=$(sinfo -h -N -n "${SLURM_JOB_NODELIST:-}" -o "%N %T" 2>/dev/null | grep -Ei '[*~]|down|drain|fail' || true)
    if [[ -n $states ]]; then
      _vitlarge_log "lost: $(echo "$states" | paste -sd, -)"
      return 0
    fi
    ((SECONDS < deadline)) || return 1
    sleep 5
  done
}

# run_requeueable COMMAND...: runs the job step, forwards stop requests, requeues on exit 75.
# Returns the step's exit status (75 after a successful requeue request).
run_requeueable() {
  _vitlarge_log "start (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?} (${SLURM_JOB_NUM_NODES:-?} node(s)): $*"
  "$@" &
  local pid=$! rc
  # shellcheck disable=SC2064  # the pid is meant to be expanded now
  trap "_vitlarge_forward USR1 $pid" USR1
  # shellcheck disable=SC2064
  trap "_vitlarge_forward TERM $pid" TERM
  while :; do
    wait "$pid"
    rc=$?
    # > 128: our trap interrupted the wait (srun may still run, or have just exited: bash keeps its status
    # for one more `wait`), or srun died of a signal (then that `wait` has nothing more: 127).
    if ((rc > 128)); then
      local again
      wait "$pid" 2>/dev/null
      again=$?
      if ((again != 127)); then rc=$again; fi
      if ((rc > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
    fi
    break
  done
  trap - USR1 TERM
  if ((rc == 75)); then
    _vitlarge_log "step checkpointed and stopped (exit 75); requeueing"
    local out
    if out=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
      _vitlarge_log "requeued; the next run resumes from the newest checkpoint in the workdir"
    elif [[ $out == *"pending"* ]]; then
      # Slurm requeues by itself on preemption (PreemptMode=REQUEUE) and on `scontrol requeue`.
      _vitlarge_log "already requeued by Slurm; the next run resumes from the newest checkpoint in the workdir"
    else
      # Cancelled, or past the time limit: the checkpoint is there, the queue entry is not.
      _vitlarge_log "scontrol requeue failed ($out); submit the same sbatch command again to resume"
    fi
  elif ((rc != 0)) && _vitlarge_node_lost; then
    # Slurm requeues the job itself once the node is DOWN (NODE_FAIL, after SlurmdTimeout); a node a
    # health check drained, or one whose GPU or NIC failed while slurmd lives, ends only the step.
    _vitlarge_log "step exited with status $rc after losing a node; requeueing to continue on the nodes the job gets"
    scontrol requeue "$SLURM_JOB_ID" 2>&1 | sed 's/^/vitlarge[slurm] scontrol: /' >&2 || true
  else
    _vitlarge_log "step exited with status $rc"
  fi
  return "$rc"
}
