#!/bin/bash
# wait for port
while [ ! -f /tmp/d6/port ]; do sleep 1; done
port=$(cat /tmp/d6/port); pid=$1; n=0
while [ -f /tmp/d6/port ] && [ $n -lt 40 ]; do
  out=$(ss -tanpi "( dport = :$port )" 2>/dev/null)
  # client-side conns with nothing sent and established > 700 ms ago
  stuck=$(echo "$out" | grep -A1 '^ESTAB' | paste - - | grep -v bytes_sent | grep -o 'lastrcv:[0-9]*' | awk -F: '$2>700' | wc -l)
  if [ "$stuck" -gt 0 ]; then
    n=$((n+1)); echo "$(date +%T.%N) stuck=$stuck" >> /tmp/d6/mon.log
    [ -n "$DUMP" ] && [ $n -le 2 ] && /work/main/.venv/bin/py-spy dump --native --pid $pid > /tmp/d6/client$n.txt 2>&1
    echo "$out" > /tmp/d6/ss$n.txt
    sleep 1
  fi
  sleep 0.3
done
