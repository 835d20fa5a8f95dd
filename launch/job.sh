#!/bin/bash
# Runs one job on a TPU VM worker: `bash job.sh NAME COMMAND...` (started by `python -m launch.tpu run`).
#
# Writes the job's process id to ~/bert_jax_logs/NAME.pid (for `stop`) and, when it ends, its exit
# status to NAME.exit (for `supervise`). A SIGTERM to this wrapper means the VM is shutting down
# (preemption or maintenance; `stop` signals the job itself), so NAME.exit then says "preempted",
# never a clean 0 that would read as "finished".
name=$1
shift
logs="$HOME/bert_jax_logs"

# A previous instance of this job still alive here (e.g. hung in a collective after another worker
# crashed) holds the TPU: end it first. Its BERT_JAX_JOB variable proves the pid is still that job.
old=$(cat "$logs/$name.pid" 2>/dev/null)
if [ -n "$old" ] && grep -qsxz "BERT_JAX_JOB=$name" "/proc/$old/environ"; then
  echo $$ > "$logs/$name.pid"   # no longer the old job's: its wrapper, woken by the kill, writes no NAME.exit
  echo "killing the previous $name (pid $old)"
  kill -KILL "$old"
  while kill -0 "$old" 2>/dev/null; do sleep 1; done
fi

# NAME.exit is written only by the wrapper of the job NAME.pid names: a previous wrapper, whose job was
# killed above, must not write its 137 over the new job's state.
export BERT_JAX_JOB=$name
trap '[ "$(cat "$logs/$name.pid" 2>/dev/null)" = "$child" ] && echo preempted > "$logs/$name.exit"; exit 143' TERM
"$@" &
child=$!
echo $child > "$logs/$name.pid"
wait $child
rc=$?
[ "$(cat "$logs/$name.pid" 2>/dev/null)" = "$child" ] && echo $rc > "$logs/$name.exit"
exit $rc
