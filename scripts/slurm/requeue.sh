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

_vitlarge_log() { echo "vitlarge[slurm] $(date '+%F %T') job ${SLURM_JOB_ID:-?}: $*" >&2; }

_vitlarge_forward() {  # _vitlarge_forward SIGNAL PID
  _vitlarge_log "got SIG$1: asking the step to checkpoint and stop (SIGUSR1 to srun $2)"
  kill -USR1 "$2" 2>/dev/null || true
}

# run_requeueable COMMAND...: runs the job step, forwards stop requests, requeues on exit 75.
# Returns the step's exit status (75 after a successful requeue request).
run_requeueable() {
  _vitlarge_log "start (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}: $*"
  "$@" &
  local pid=$! rc
  # shellcheck disable=SC2064  # the pid is meant to be expanded now
  trap "_vitlarge_forward USR1 $pid" USR1
  # shellcheck disable=SC2064
  trap "_vitlarge_forward TERM $pid" TERM
  while :; do
    wait "$pid"
    rc=$?
    # > 128 with srun still there (possibly a zombie): our trap interrupted the wait.
    if ((rc > 128)) && kill -0 "$pid" 2>/dev/null; then continue; fi
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
  else
    _vitlarge_log "step exited with status $rc"
  fi
  return "$rc"
}
