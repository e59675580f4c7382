// Command ratelimit runs Leapgate, the Envoy rate-limit service.
//
//	ratelimit                    serve (settings from the environment)
//	ratelimit check-config DIR   validate a rule directory and exit
//	ratelimit --version          print the version and exit
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs explicit; it returns the exit
// status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "check-config":
			return checkConfig(args[1:], stdout, stderr)
		case "-version", "--version", "version":
			fmt.Fprintln(stdout, server.Build())
			return 0
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, usage)
			return 0
		default:
			fmt.Fprintf(stderr, "unknown command %q\n%s", args[0], usage)
			return 2
		}
	}
	settings, err := config.Load()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	logger := settings.NewLogger(stderr)
	logger.Info("starting", "settings", settings)
	for _, u := range config.UnhonouredInEnvironment() {
		logger.Warn("envoyproxy/ratelimit setting not honoured by Leapgate; see docs/migrating.md", "name", u.Name, "instead", u.Why)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// The first signal starts the graceful shutdown; restoring the default
	// handling then lets a second one end the process at once.
	context.AfterFunc(ctx, stop)
	srv, err := server.New(settings, logger)
	if err != nil {
		logger.Error("cannot start", "error", err)
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		logger.Error("stopped with an error", "error", err)
		return 1
	}
	return 0
}

const usage = `usage:
  ratelimit                    serve; settings come from environment variables
                               (every one, with its default: docs/settings.md)
  ratelimit check-config DIR   validate the rule files in DIR; exit status 1 on any error
  ratelimit --version          print the version, commit and Go version
  ratelimit --help             print this
`

func checkConfig(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	settings, err := config.Load()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if !server.CheckConfig(args[0], settings, stdout) {
		return 1
	}
	return 0
}
