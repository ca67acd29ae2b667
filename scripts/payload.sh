# Sourced by the benchmark scripts: the payload write-bw's packets carry.
# payload_of MTU [client options...]: the payload a -m/--mtu among the options gives (in any
# spelling: -m N, -mN, -m=N, --mtu N, --mtu=N), else the tools' default at that interface MTU:
# the largest multiple of 64 bytes beside IPv4, UDP and 64 bytes of headers, up to 16 KiB
# (perf::payload_for).
payload_of() {
  local p args i
  p=$(( ($1 - 20 - 8 - 64) / 64 * 64 ))
  [ "$p" -gt 16384 ] && p=16384
  shift
  args=("$@")
  for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
      -m | --mtu) p=${args[$((i + 1))]:-$p} ;;
      --mtu=*) p=${args[$i]#--mtu=} ;;
      -m*) p=${args[$i]#-m}; p=${p#=} ;;
    esac
  done
  echo "$p"
}
