//go:build !linux

package testsvc

// Freeze stops the server with SIGSTOP, which these tests exercise on
// Linux only: elsewhere it skips the test.
func (s *S3Server) Freeze() (thaw func()) {
	s.p.t.Skip("SIGSTOP of the S3 server is exercised on linux")
	return func() {}
}

// AllThreadsStopped reads /proc, which only Linux has.
func AllThreadsStopped(pid int) bool { return true }
