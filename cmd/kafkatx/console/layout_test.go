package console

import (
	"io/fs"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A chart at low lag is not an empty box: at lag 0 throughout, and from one sample, it draws
// its baseline, the lag line on it, a dot at the latest lag inside the plot and the text
// "lag 0"; at lag 3 the line stands above the baseline.
func TestChartAtLowLagShowsBaselineAndValue(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	flat := []Sample{{At: at, Lag: 0}, {At: at.Add(time.Minute), Lag: 0}, {At: at.Add(2 * time.Minute), Lag: 0}}
	low := []Sample{{At: at, Lag: 1}, {At: at.Add(time.Minute), Lag: 3}}
	num := `([0-9.]+)`
	axis := regexp.MustCompile(`<line class="axis" x1="` + num + `" y1="` + num + `" x2="` + num + `" y2="` + num + `"/>`)
	dot := regexp.MustCompile(`<circle class="now" cx="` + num + `" cy="` + num + `" r="2.5"/>`)
	for _, c := range []struct {
		name    string
		samples []Sample
		w, h    int
		labels  bool
		text    string
		above   bool // the dot stands above the baseline
	}{
		{"lag 0, small", flat, 160, 34, false, `>lag 0<`, false},
		{"lag 0, one sample", flat[:1], 160, 34, false, `>lag 0<`, false},
		{"lag 0, large", flat, 420, 110, true, `>lag 0 now (scale 1)<`, false},
		{"lag 1 to 3, small", low, 160, 34, false, `>lag 3<`, true},
	} {
		svg := string(chartSVG(c.samples, c.w, c.h, c.labels))
		a, d := axis.FindStringSubmatch(svg), dot.FindStringSubmatch(svg)
		if a == nil || d == nil || !strings.Contains(svg, `<polyline class="lag"`) || !strings.Contains(svg, c.text) {
			t.Errorf("%s: want a baseline, the lag line, a dot and %q:\n%s", c.name, c.text, svg)
			continue
		}
		f := func(s string) float64 {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			return v
		}
		x1, y, x2, cx, cy := f(a[1]), f(a[2]), f(a[3]), f(d[1]), f(d[2])
		if x1 < 1 || x2 > float64(c.w-1) || y > float64(c.h-2) || y < 12 || cx < x1 || cx > x2 {
			t.Errorf("%s: baseline from %v to %v at %v, dot at %v: want them inside the %dx%d box, below the text", c.name, x1, x2, y, cx, c.w, c.h)
		}
		if on := math.Abs(cy-y) < 0.5; on == c.above {
			t.Errorf("%s: dot at y %v, baseline at y %v: want above %v", c.name, cy, y, c.above)
		}
	}
}

// Every table of every page sits in a div.scroll, which scrolls when the table cannot fit
// (console.css); the page itself never does.
func TestEveryTableScrollsInItsOwnContainer(t *testing.T) {
	t.Parallel()
	pages, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil || len(pages) == 0 {
		t.Fatalf("templates: %v %v", pages, err)
	}
	tables := 0
	for _, p := range pages {
		b, err := fs.ReadFile(templateFS, p)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		tables += strings.Count(s, "<table")
		if n, wrapped := strings.Count(s, "<table"), strings.Count(s, `<div class="scroll"><table`); n != wrapped {
			t.Errorf("%s: %d tables, %d of them in <div class=\"scroll\">", p, n, wrapped)
		}
	}
	if tables < 10 {
		t.Fatalf("found %d tables in the templates, want the dozen or so the console has", tables)
	}
}
