package results

// ReadEventsForTest exposes the test's independent event-file decoder to
// the package's external tests.
var ReadEventsForTest = readEvents

func (e event) Step() int64                { return e.step }
func (e event) Values() map[string]float32 { return e.values }
