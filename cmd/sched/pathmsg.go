package main

import (
	"fmt"
	"strings"
)

// onPath is err, the failure of what on path, with path named once: the
// errors of model and tokenizer (their FormatErrors) begin with the path
// already, where "what path: err" would name it twice.
func onPath(what, path string, err error) error {
	if strings.HasPrefix(err.Error(), path+": ") {
		return fmt.Errorf("%s %w", what, err)
	}
	return fmt.Errorf("%s %s: %w", what, path, err)
}
