#!/bin/sh
# A custom plugin in node-problem-detector's convention, for sonde's tests:
# exit 0 when "$FLAG_DIR/$1" is absent, 1 (a problem) when it holds a
# message, 2 (unknown) when it holds "unknown", and it hangs when it holds
# "hang". The message is what the file holds.
file="$FLAG_DIR/$1"
if [ ! -e "$file" ]; then
  echo "no $1 file"
  exit 0
fi
text=$(cat "$file")
case "$text" in
  unknown) echo "cannot tell"; exit 2 ;;
  hang) sleep 60 ;;
esac
echo "$text"
exit 1
