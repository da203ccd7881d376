#!/bin/sh
# Fails when the guard's crash handler (shim/guard/crash.c, compiled) may call a function that is
# not async-signal-safe: every symbol its object file leaves undefined must be on the list below.
# crash.c holds the handler and everything it calls, so its undefined symbols are what it calls.
#   usage: signal_safe.sh CRASH_OBJECT   (build/shim/CMakeFiles/dpshim_layers.dir/guard/crash.c.o)
set -eu
obj=${1:-}
if [ -z "$obj" ] || [ ! -f "$obj" ]; then
    echo "signal_safe: no object file '$obj': build shim/guard/crash.c first"
    exit 1
fi

# POSIX.1-2017 async-signal-safe functions (memcpy, memset, strlen... since POSIX.1-2016) that a
# crash handler has use for; the compiler may also emit memcpy/memset/memmove for plain loops.
safe="write raise sigaction sigemptyset sigfillset sigaddset sigdelset sigismember sigprocmask
pthread_sigmask kill getpid _exit abort memcpy memmove memset memcmp strlen strnlen"
# syscall(2): no POSIX function, but glibc's is only the trap with its arguments moved into
# registers; the handler writes its report with it (shim/core/sys.h), past the shim's interposers.
safe="$safe syscall"
# Emitted by the toolchain, never a library service: the GOT that PIC code reaches data through,
# the stack protector's failure path (it aborts), _FORTIFY_SOURCE's checked variants of the above.
toolchain="_GLOBAL_OFFSET_TABLE_ __stack_chk_fail __memcpy_chk __memmove_chk __memset_chk"
# The guard's own state, read (relaxed atomic loads) by the handler: data, not functions.
state="dps_guard_pos dps_guard_conf"

bad=0
for sym in $(nm -u "$obj" | awk '{ print $NF }' | sed 's/@.*//'); do
    case " $(echo $safe $toolchain $state) " in
    *" $sym "*) ;;
    *)
        echo "signal_safe: $obj: the crash handler's file uses '$sym', which is not async-signal-safe"
        bad=1
        ;;
    esac
done
[ $bad -eq 0 ] && echo "signal_safe: $obj calls async-signal-safe functions only"
exit $bad
