package plan

import (
	"syscall"
	"time"
)

// cpuTime is this process's CPU time so far, user and system (0 where it
// cannot be read).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
