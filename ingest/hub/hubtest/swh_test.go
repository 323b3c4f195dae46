package hubtest

import (
	"net/http"
	"testing"
)

// A test changes the bucket while a client keeps asking it, with its
// setters: the client sees it go down (503) and come back (200). Under
// -race this is clean, where writing Down as the server read it was a
// data race: nothing the test does after the write orders it before the
// server's next read.
func TestSWHGoesDownAndComesBackWhileItServes(t *testing.T) {
	s := NewSWH()
	defer s.Close()
	s.Add("b1", []byte("print(1)\n"))
	// Buffered: a receive that orders nothing before the client's next
	// request, so that only the setter's lock orders the change.
	codes := make(chan int, 1<<16)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(codes)
		for {
			resp, err := http.Get(s.URL() + "/content/b1")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			select {
			case codes <- resp.StatusCode:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	waitCode := func(want int) {
		t.Helper()
		for code := range codes {
			if code == want {
				return
			}
		}
		t.Fatalf("the client stopped before the bucket answered %d", want)
	}
	waitCode(http.StatusOK)
	s.SetDown(true)
	waitCode(http.StatusServiceUnavailable)
	s.SetDown(false)
	waitCode(http.StatusOK)
}
