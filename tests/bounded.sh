# tests/bounded.sh: `bounded COMMAND...`, sourced by the suites that run
# commands which might hang (tests/mpi/run.sh, tests/readme/run.lua).
# It prints COMMAND's output and returns its status; a command that printed
# nothing for $IDLE seconds, or ran $CAP seconds in all, is stopped
# (status 124). Progress decides, not a wall-clock guess: on a loaded
# machine a command that keeps printing takes as long as it needs, and a
# silent (hung) one is stopped after IDLE s. SIGTERM first, SIGKILL 5 s
# later (mpirun can ignore SIGTERM while a rank sits in MPI_Finalize).
IDLE=${IDLE:-60} CAP=${CAP:-900}
bounded() {
  local log rc pid size=-1 grown quiet=0 ticks=0
  log=$(mktemp "${TMPDIR:-/tmp}/fsdp-bounded-out.XXXXXX")
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.1
    ticks=$((ticks + 1))
    grown=$(stat -c %s "$log" 2>/dev/null || echo 0)
    if [ "$grown" != "$size" ]; then size=$grown quiet=0; else quiet=$((quiet + 1)); fi
    if [ "$quiet" -ge $((IDLE * 10)) ] || [ "$ticks" -ge $((CAP * 10)) ]; then
      kill -TERM "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      cat "$log"
      rm -f "$log"
      return 124
    fi
  done
  wait "$pid"
  rc=$?
  cat "$log"
  rm -f "$log"
  return $rc
}
