package lapse

import (
	"errors"
	"testing"
)

func TestALapseIsSaidWhenItBeginsAndWhenItEnds(t *testing.T) {
	var l Lapse
	down := errors.New("connection refused")
	type said struct {
		first bool
		back  int
	}
	steps := []struct {
		err  error
		want said
	}{
		{nil, said{}},
		{down, said{first: true}},
		{down, said{}},
		{down, said{}},
		{nil, said{back: 3}},
		{nil, said{}},
		{down, said{first: true}},
		{nil, said{back: 1}},
	}
	for i, s := range steps {
		first, back := l.Note(s.err)
		if (said{first, back}) != s.want {
			t.Fatalf("attempt %d (err %v): first %v, back %d; want %+v", i, s.err, first, back, s.want)
		}
	}
}
