package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The Markdown a newcomer reads, relative to this package's directory.
const repoRoot = "../.."

var (
	// inlineLink is [text](target) and ![alt](target), with an optional title.
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// refLink is a reference definition: [name]: target
	refLink = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	// codeSpan is inline code, where brackets are not links.
	codeSpan = regexp.MustCompile("`[^`]*`")
	// linkText is a link in a heading, whose anchor keeps only its text.
	linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	// scheme marks an absolute URL (https:, mailto:), not checked here.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// TestDocLinksResolve keeps the relative links of README.md, BENCHMARKS.md
// and docs/*.md true: each names a file or directory that exists relative
// to the page that links it (GitHub resolves them so), never the page
// itself, and an #anchor names a heading of its target. A page moved into
// docs/ that keeps its docs/ prefixes, or a renamed heading, fails here
// rather than in a reader's browser.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "BENCHMARKS.md"))

	anchors := map[string]map[string]bool{} // page -> its headings' anchors
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(text))
		anchors[page] = a
		return a
	}

	checked := 0
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repoRoot, page)
		for n, line := range proseLines(string(text)) {
			if line == "" {
				continue
			}
			line = codeSpan.ReplaceAllString(line, "")
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if scheme.MatchString(target) {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := page
				if path != "" {
					dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(path))
					if filepath.Clean(dest) == filepath.Clean(page) {
						t.Errorf("%s:%d: %q links to the page itself; use #anchor", name, n+1, target)
						continue
					}
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: %q does not resolve (from %s)", name, n+1, target, filepath.Dir(name))
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: %q: no heading with anchor #%s", name, n+1, target, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative links at all; is the pattern wrong?")
	}
}

// proseLines is the page's lines with those of fenced code blocks blanked,
// so line numbers stay true and a shell comment is not taken for a heading.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		switch {
		case fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			fence = trimmed[:3]
			lines[i] = ""
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			lines[i] = ""
		}
	}
	return lines
}

// headingAnchors is the set of anchors GitHub gives the page's headings:
// lower case, punctuation dropped, spaces as hyphens, -1, -2, ... on repeats.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range proseLines(text) {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(l, "#"))
		title = linkText.ReplaceAllString(title, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}
