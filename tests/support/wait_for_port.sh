# Sourced by test scripts that start a kvserver with --port=0 --port_file=FILE.
#
# wait_for_port PORT_FILE PID LOG: prints the port the kvserver (process PID) wrote to PORT_FILE
# once it is there, waiting up to 20 s. Status 1, with LOG and the reason on stderr, when the
# process exited first or never wrote the file. Use: port=$(wait_for_port ...) || exit 1
wait_for_port() {
  local file=$1 pid=$2 log=$3
  for _ in $(seq 1 200); do
    if [[ -s $file ]]; then
      cat "$file"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      cat "$log" >&2
      echo "kvserver exited before it wrote $file" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "kvserver did not start (no $file after 20 s)" >&2
  return 1
}
