// Command warren is the Warren daemon and its command line client.
package main

import "github.com/warrenrl/warren/internal/cli"

func main() { cli.Execute() }
