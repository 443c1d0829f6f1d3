package integration

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

var httpClient = &http.Client{Timeout: 5 * time.Second}

// httpGet returns the body of a 200 answer.
func httpGet(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

// metricValue returns the value of one sample line of a Prometheus text
// exposition, e.g. faultrouter_deadlettered_input_total{kind="oversize"}.
func metricValue(exposition, sample string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	m := re.FindStringSubmatch(exposition)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// scrape reads one sample of a router's /metrics.
func scrape(t *testing.T, url, sample string) (float64, bool) {
	t.Helper()
	body, err := httpGet(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return metricValue(body, sample)
}
