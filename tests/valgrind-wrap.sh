#!/bin/sh
# The exe wrapper of `meson test --setup valgrind`. Unit tests run under valgrind
# directly; for the system suite (pytest) valgrind goes around each daemon the tests
# start (FLEETGATE_VALGRIND=1, see tests/system/fleet.py), not around Python itself.
case "$(basename "$1")" in
  python3*) FLEETGATE_VALGRIND=1 exec "$@" ;;
esac
exec valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
  --track-origins=yes -q "$@"
