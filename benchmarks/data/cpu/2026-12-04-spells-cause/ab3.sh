cd /work/main
for mode in sleep yield sleep yield; do
  rm -f /tmp/d6/port /tmp/d6/mon.log; touch /tmp/d6/mon.log
  if [ $mode = sleep ]; then export BW=1; else unset BW; fi
  (.venv/bin/python /tmp/d6/run3.py 100 x > /tmp/d6/run-$mode.log 2>&1 &)
  sleep 3; pid=$(pgrep -f "d6/run" | head -1)
  timeout 300 /tmp/d6/mon.sh $pid
  while pgrep -f d6/run >/dev/null; do sleep 1; done
  log=$(ls -t /tmp/d6/wd/vllm-*.log | head -1)
  echo "$mode stuck-events $(wc -l < /tmp/d6/mon.log) $(grep steps /tmp/d6/run-$mode.log | tail -1) patched=$(grep -c 'busy-wait\] shm' $log) running: $(grep -o 'Running: [0-9]* reqs' $log | awk '{print $2}' | paste -sd,)"
done
