// Command warren-guest is Warren's agent inside a microVM, run as its
// init (internal/guest), or with --service as a service of a full guest
// OS (the fullvm backend's image). Built static: CGO_ENABLED=0 go build.
package main

import (
	"log"
	"os"
	"time"

	"github.com/warrenrl/warren/internal/guest"
)

func main() {
	if guest.IsTrampoline() {
		guest.TrampolineMain()
		return
	}
	if guest.IsSandboxInit() {
		guest.SandboxInitMain()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == guest.ServiceFlag {
		log.Fatalf("warren-guest: %v", guest.ServiceMain())
	}
	err := guest.Main()
	log.Printf("warren-guest: %v", err)
	// PID 1 must not exit (the kernel would panic before the message is
	// out); the host sees the VM fail to answer and stops it.
	for {
		time.Sleep(time.Hour)
	}
}
