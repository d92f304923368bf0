cd /work/main
for mode in procs threads procs threads; do
  rm -f /tmp/d6/port /tmp/d6/mon.log; touch /tmp/d6/mon.log
  if [ $mode = procs ]; then script=run2.py; else script=run.py; fi
  (.venv/bin/python /tmp/d6/$script 100 > /tmp/d6/run-$mode.log 2>&1 &)
  sleep 3; pid=$(pgrep -f "d6/run" | head -1)
  timeout 300 /tmp/d6/mon.sh $pid
  while pgrep -f d6/run >/dev/null; do sleep 1; done
  echo "$mode stuck-events $(wc -l < /tmp/d6/mon.log) $(grep steps /tmp/d6/run-$mode.log | tail -1)"
done
