package hub

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// rateLimitWait reads how long a 429 (or a 503 with Retry-After) asks us to
// wait. The Hub sends the IETF RateLimit header ("api";r=0;t=55: t is
// seconds until the window resets); the older draft's "reset=55" and
// Retry-After are read as well. Without any, it backs off. A reset of 0 still waits a moment, so that a server that
// keeps answering 429 is not hammered.
func rateLimitWait(h http.Header, attempt int) time.Duration {
	const least = 50 * time.Millisecond
	if s, ok := rateLimitReset(h.Get("RateLimit")); ok {
		return max(time.Duration(s)*time.Second, least)
	}
	if ra := strings.TrimSpace(h.Get("Retry-After")); ra != "" {
		if s, err := strconv.Atoi(ra); err == nil && s >= 0 {
			return max(time.Duration(s)*time.Second, least)
		}
		if t, err := http.ParseTime(ra); err == nil {
			if d := time.Until(t); d > 0 {
				return d
			}
			return least
		}
	}
	return backoff(attempt)
}

// rateLimitReset finds the seconds-until-reset parameter in a RateLimit
// header value, in either the structured-field form (t=) or the older
// key-value form (reset=).
func rateLimitReset(v string) (int, bool) {
	if v == "" {
		return 0, false
	}
	for _, part := range strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ',' }) {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || (k != "t" && k != "reset") {
			continue
		}
		s, err := strconv.Atoi(strings.TrimSpace(val))
		if err == nil && s >= 0 {
			return s, true
		}
	}
	return 0, false
}
