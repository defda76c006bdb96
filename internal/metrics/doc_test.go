package metrics_test

import (
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/metrics"
)

// docRow is a row of docs/operations.md's table of series: its names and
// its labels column.
var docRow = regexp.MustCompile("^\\| (`idempay_[^|]*)\\| [a-z]+ \\|([^|]*)\\|")

// backticked is a name in backticks.
var backticked = regexp.MustCompile("`([^`]+)`")

// TestOperationsDocListsEverySeries: every idempay_ series the registry
// exposes has a row in docs/operations.md with its labels, and every row
// names a series it exposes. Every Observe method is called first (with
// placeholder values, found by reflection), so a series added with its
// observer fails here until the doc has its row.
func TestOperationsDocListsEverySeries(t *testing.T) {
	t.Parallel()
	// The pool series too, and the webhooks-out backlog, which has a
	// series only while a delivery is pending.
	m := metrics.New(newHooksOut(t).env.Pool)
	v := reflect.ValueOf(m)
	called := 0
	for i := range v.NumMethod() {
		if !strings.HasPrefix(v.Type().Method(i).Name, "Observe") {
			continue
		}
		fn := v.Method(i)
		args := make([]reflect.Value, fn.Type().NumIn())
		for j := range args {
			args[j] = reflect.New(fn.Type().In(j)).Elem()
			switch args[j].Kind() {
			case reflect.String:
				args[j].SetString("x")
			case reflect.Int, reflect.Int64:
				if args[j].Type() == reflect.TypeFor[time.Duration]() {
					args[j].SetInt(int64(time.Millisecond))
				} else {
					args[j].SetInt(200)
				}
			}
		}
		fn.Call(args)
		called++
	}
	m.ObserveReconcile("refund", "x") // the refunds' own series
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed := map[string][]string{} // series -> its label names
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "idempay_") {
			continue
		}
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		exposed[f.GetName()] = labels
	}
	if called < 8 || len(exposed) < 20 {
		t.Fatalf("called %d Observe methods and found %d series; the test no longer sees the metrics", called, len(exposed))
	}

	text, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{}
	for line := range strings.Lines(string(text)) {
		row := docRow.FindStringSubmatch(line)
		if row == nil {
			continue
		}
		var labels []string
		for _, l := range backticked.FindAllStringSubmatch(row[2], -1) {
			labels = append(labels, l[1])
		}
		for _, n := range backticked.FindAllStringSubmatch(row[1], -1) {
			documented[n[1]] = labels
		}
	}
	for _, name := range slices.Sorted(maps.Keys(exposed)) {
		labels, ok := documented[name]
		switch {
		case !ok:
			t.Errorf("docs/operations.md has no row for %s (labels %v)", name, exposed[name])
		case !slices.Equal(slices.Sorted(slices.Values(labels)), slices.Sorted(slices.Values(exposed[name]))):
			t.Errorf("docs/operations.md gives %s the labels %v, the registry %v", name, labels, exposed[name])
		}
	}
	for name := range documented {
		if _, ok := exposed[name]; !ok {
			t.Errorf("docs/operations.md has a row for %s, which the registry does not expose", name)
		}
	}
}

// TestRolloutHelpNamesEveryOutcome: the Help of
// idempay_idempotency_rollout_total, which a scrape shows, names every
// outcome that docs/operations.md's row lists for it (what the rollout
// counts, docs/api.md's "Rollout"), so that an outcome added to one is
// added to the other.
func TestRolloutHelpNamesEveryOutcome(t *testing.T) {
	t.Parallel()
	const name = "idempay_idempotency_rollout_total"
	m := metrics.New(nil)
	m.ObserveRollout("shadow", "x")
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	help := ""
	for _, f := range families {
		if f.GetName() == name {
			help = f.GetHelp()
		}
	}
	text, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for line := range strings.Lines(string(text)) {
		if !strings.HasPrefix(line, "| `"+name+"`") {
			continue
		}
		cells := strings.Split(line, "|")
		for _, w := range backticked.FindAllStringSubmatch(cells[4], -1) {
			outcomes = append(outcomes, w[1])
		}
	}
	if help == "" || len(outcomes) < 2 {
		t.Fatalf("%s: Help %q, outcomes in docs/operations.md %v; the test no longer finds them", name, help, outcomes)
	}
	for _, o := range outcomes {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(o) + `\b`).MatchString(help) {
			t.Errorf("the Help of %s does not name the outcome %s, which docs/operations.md lists: %q", name, o, help)
		}
	}
}
