// Command mq opens the POSIX message queue named by its second argument:
// "create" makes it (and leaves it), "open" opens an existing one. It
// prints "ok" or the errno's name, for fncall's isolation test.
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	name, err := unix.BytePtrFromString(os.Args[2]) // without the leading '/', as the syscall takes it
	if err != nil {
		panic(err)
	}
	flags := unix.O_RDWR
	if os.Args[1] == "create" {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), uintptr(flags), 0o600, 0, 0, 0)
	if e != 0 {
		fmt.Println(unix.ErrnoName(e))
		os.Exit(1)
	}
	_ = fd // left open: the kill at the end of the step closes it
	fmt.Println("ok")
}
