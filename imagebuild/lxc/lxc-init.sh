#!/bin/sh
# PID 1 of a Proxmox container made by `imagebuild export-lxc` from an image without an init
# (docs/proxmox.md): the image's environment, /dev/shm, ifupdown networking when the image has it,
# then the image's command with the console as stdin. Stop signals go on to the command; the
# container ends when the command does. With no command it idles until stopped.
. /etc/profile.d/imagebuild.sh
mountpoint -q /dev/shm 2>/dev/null ||
  { mkdir -p /dev/shm && mount -t tmpfs -o nosuid,nodev,mode=1777 shm /dev/shm; } 2>/dev/null
if command -v ifup >/dev/null 2>&1 && [ -f /etc/network/interfaces ]; then ifup -a; fi
set --
. /etc/imagebuild/command
[ "$#" -gt 0 ] || set -- sleep infinity
# sh gives a background job /dev/null as stdin, so the console goes through fd 3.
exec 3<&0
"$@" <&3 3<&- &
exec 3<&-
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP PWR
wait "$child"; status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
exit "$status"
