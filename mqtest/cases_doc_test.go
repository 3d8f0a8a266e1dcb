package mqtest

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite README.md's case table from Cases()")

const (
	readmeFile  = "../README.md"
	readmeBegin = "<!-- mqtest cases begin -->"
	readmeEnd   = "<!-- mqtest cases end -->"
	regenerate  = "go test ./mqtest -run TestCaseDocs -update"
)

// TestCaseDocs keeps README.md's table of the cases equal to what Cases() says.
func TestCaseDocs(t *testing.T) {
	readme, err := os.ReadFile(readmeFile)
	require.NoError(t, err)
	table, err := withCaseTable(string(readme), Cases())
	require.NoError(t, err)

	if *update {
		require.NoError(t, os.WriteFile(readmeFile, []byte(table), 0o644))
		return
	}
	assert.Equal(t, table, string(readme), "README.md's case table is not what Cases() generates; run: %s", regenerate)
}

// TestCasesAreDescribed requires every case to say what it proves and publishes, under
// a name no other case has, and to name only hooks and flags that exist.
func TestCasesAreDescribed(t *testing.T) {
	hooks, flags := map[string]bool{}, map[string]bool{}
	for _, f := range fieldsOf[Harness]() {
		hooks[f] = f != "New" && f != "Caps"
	}
	for _, f := range fieldsOf[Caps]() {
		flags[f] = true
	}
	seen := map[string]bool{}
	for _, c := range Cases() {
		assert.False(t, seen[c.Name], "%s is listed twice", c.Name)
		seen[c.Name] = true
		assert.NotEmpty(t, c.Proves, "%s: Proves", c.Name)
		assert.NotEmpty(t, c.Publishes, "%s: Publishes", c.Name)
		for _, h := range c.Hooks {
			assert.True(t, hooks[h], "%s: hook %q is no Harness field", c.Name, h)
		}
		for _, f := range c.Flags {
			assert.True(t, flags[f], "%s: flag %q is no Caps field", c.Name, f)
		}
	}
	assert.Equal(t, CaseNames(), names(Cases()))
}

func names(cs []Case) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.Name
	}
	return out
}

// withCaseTable returns readme with the Markdown table of cs between the markers.
func withCaseTable(readme string, cs []Case) (string, error) {
	begin := strings.Index(readme, readmeBegin)
	end := strings.Index(readme, readmeEnd)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("README.md has no %s ... %s markers", readmeBegin, readmeEnd)
	}
	var b strings.Builder
	b.WriteString(readmeBegin + "\n")
	fmt.Fprintf(&b, "<!-- generated from mqtest.Cases() by `%s` -->\n\n", regenerate)
	b.WriteString("| Case | Proves | Hooks | Flags | Publishes |\n| --- | --- | --- | --- | --- |\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", c.Name, cell(c.Proves), cell(strings.Join(c.Hooks, ", ")),
			cell(strings.Join(c.Flags, ", ")), cell(c.Publishes))
	}
	b.WriteString("\n")
	return readme[:begin] + b.String() + readme[end:], nil
}

// cell escapes what Markdown would read as a column break or an HTML tag.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}

// fieldsOf are the names of T's fields.
func fieldsOf[T any]() []string {
	typ := reflect.TypeFor[T]()
	out := make([]string, typ.NumField())
	for i := range out {
		out[i] = typ.Field(i).Name
	}
	return out
}
