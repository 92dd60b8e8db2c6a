// Reads a JSON array of [pattern, text] pairs on stdin and writes, for
// each, what Go's regexp makes of it: [compiles, start, end] of the
// leftmost-first match (-1, -1 for none). Used by tests/against_go.rs.
package main

import (
	"encoding/json"
	"os"
	"regexp"
)

func main() {
	var cases [][2]string
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	answers := make([][3]int, len(cases))
	for i, c := range cases {
		re, err := regexp.Compile(c[0])
		if err != nil {
			answers[i] = [3]int{0, -1, -1}
			continue
		}
		answers[i] = [3]int{1, -1, -1}
		if m := re.FindStringIndex(c[1]); m != nil {
			answers[i] = [3]int{1, m[0], m[1]}
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(answers); err != nil {
		panic(err)
	}
}
