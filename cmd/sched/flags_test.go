package main

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A flag name means one thing on every command: no command declares a flag
// of its own under the name of one of the root's persistent flags, which
// would shadow the global one there and make it mean something else.
func TestNoFlagShadowsAGlobalFlag(t *testing.T) {
	global := map[string]bool{}
	rootCmd.PersistentFlags().VisitAll(func(f *pflag.Flag) { global[f.Name] = true })
	if !global["config"] || !global["tokenizer"] || !global["data-dir"] {
		t.Fatalf("the root's persistent flags are %v: the walk below would check nothing", global)
	}
	commands := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		commands++
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if c != rootCmd && global[f.Name] {
					t.Errorf("'%s' declares --%s, a global flag's name: name its own flag otherwise", c.CommandPath(), f.Name)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
	if commands < 20 {
		t.Fatalf("walked %d commands; the tree has more", commands)
	}
}
