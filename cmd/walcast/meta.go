package main

import "github.com/spf13/cobra"

// metaCmds are the reference metadata service's commands.
func metaCmds(*globals) []*cobra.Command { return nil }
