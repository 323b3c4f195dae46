package main

import "testing"

// Every container's log is rotated with a bound on its size: Docker's
// default json-file driver keeps a log whole, and a worker's grows by
// about 1.5 KB per ingested file, gigabytes for a large ingest.
func TestComposeRotatesEveryContainersLog(t *testing.T) {
	t.Parallel()
	p := loadCompose(t)
	for name, s := range p.Services {
		l := s.Logging
		if l == nil || l.Driver != "local" || l.Options["max-size"] == "" || l.Options["max-file"] == "" {
			t.Errorf("service %s: logging %+v; want the local driver with max-size and max-file", name, l)
		}
	}
}
