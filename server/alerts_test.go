package server_test

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// githubAnchor is the anchor GitHub gives a Markdown heading: lower case,
// punctuation dropped (but - and _), spaces as hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// markdownAnchors returns the anchors of a Markdown file's headings.
func markdownAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	anchors := map[string]bool{}
	sc := bufio.NewScanner(f)
	fenced := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if !fenced && strings.HasPrefix(line, "#") {
			anchors[githubAnchor(strings.TrimLeft(line, "#"))] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return anchors
}

// TestR9_6_AlertsLinkTheirRunbooks: every alert of
// deploy/prometheus/alerts.yaml has a runbook_url into docs/operations.md
// whose anchor is a heading there, and a summary.
func TestR9_6_AlertsLinkTheirRunbooks(t *testing.T) {
	raw, err := os.ReadFile("../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(t, "../docs/operations.md")
	const prefix = "https://github.com/walcast/walcast/blob/main/docs/operations.md#"
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, prefix)
			switch {
			case !ok:
				t.Errorf("%s: runbook_url %q is not under %s", r.Alert, url, prefix)
			case !anchors[anchor]:
				t.Errorf("%s: runbook_url's anchor #%s is no heading of docs/operations.md", r.Alert, anchor)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d alerts found", n)
	}
}

// TestR9_6_AlertRulesUnitTests runs promtool's unit tests of the alert
// rules (deploy/prometheus/alerts_test.yaml: two clusters in one
// Prometheus). It skips, saying so, without promtool (Debian's prometheus
// package; .ci/run installs it and runs them too).
func TestR9_6_AlertRulesUnitTests(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("SKIPPED: no promtool (apt-get install prometheus): the alert rules' unit tests did not run")
	}
	out, err := exec.Command(promtool, "test", "rules", "../deploy/prometheus/alerts_test.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
