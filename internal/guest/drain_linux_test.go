package guest

import (
	"os"
	"sync"
	"testing"
	"time"
)

// TestOutputWrittenBeforeExitIsNotCut: what a command wrote before its
// exit reaches the host whole though a child it left holds its pipe
// open and the first chunk's send outlasts lingerGrace (a TCG guest's
// link to the host): waitDrained's deadline ends the wait for more, not
// what is in the pipe already.
func TestOutputWrittenBeforeExitIsNotCut(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // the child's end, open past the exit
	var mu sync.Mutex
	var got []byte
	first := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer r.Close()
		pumpOut(r, func(b []byte) {
			mu.Lock()
			got = append(got, b...)
			mu.Unlock()
			once.Do(func() { close(first); time.Sleep(3 * lingerGrace) })
		})
	}()
	if _, err := w.WriteString("sh: 1: "); err != nil {
		t.Fatal(err)
	}
	<-first
	if _, err := w.WriteString("Cannot fork\n"); err != nil {
		t.Fatal(err)
	}
	// The command exits now.
	waitDrained(&wg, []*os.File{r})
	mu.Lock()
	defer mu.Unlock()
	if string(got) != "sh: 1: Cannot fork\n" {
		t.Fatalf("the host got %q of what was written before the exit", got)
	}
}
