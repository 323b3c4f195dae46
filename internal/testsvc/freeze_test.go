package testsvc

import (
	"net/http"
	"runtime"
	"testing"
)

// A frozen server has stopped whole when Freeze returns: a request sent
// then is answered only once it is thawed. kill(2) alone left a thread of
// it running, which answered a listing sent after the kill on a loaded
// machine.
func TestAFrozenServerAnswersOnlyOnceThawed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP of the S3 server is exercised on linux")
	}
	s := S3(t)
	thaw := s.Freeze()
	if !AllThreadsStopped(s.Pid()) {
		t.Fatal("Freeze returned with a thread of versitygw still running")
	}
	answered := make(chan error, 1)
	go func() {
		resp, err := http.Get(s.URL() + "/")
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	if !AllThreadsStopped(s.Pid()) {
		t.Fatal("a request woke versitygw while it was frozen")
	}
	thaw()
	if err := <-answered; err != nil {
		t.Fatalf("request to the thawed server: %v", err)
	}
	thaw() // a second thaw does nothing
}
