package cli

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/warrenrl/warren/client"
	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/bench"
	"github.com/warrenrl/warren/internal/gateway"
	"github.com/warrenrl/warren/internal/membership"
	"github.com/warrenrl/warren/internal/server"
)

// loopbackPort returns a port free on TCP and UDP of 127.0.0.1 now.
func loopbackPort() (int, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if u, err := net.ListenPacket("udp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			u.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port")
}

// runCreateGateway runs `bench create --gateway`: the private daemon
// joins a gossip pool on loopback with a TCP listener, and a gateway in
// this process joins it.
func runCreateGateway(cmd *cobra.Command, bf *benchFlags, cfg bench.CreateConfig) error {
	var ports [3]int
	for i := range ports {
		p, err := loopbackPort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	kf, err := os.CreateTemp("", "warren-bench-gossip-key-")
	if err != nil {
		return err
	}
	defer os.Remove(kf.Name())
	if _, err := kf.Write(key); err != nil {
		kf.Close()
		return err
	}
	kf.Close()
	nodeAPI := "127.0.0.1:" + strconv.Itoa(ports[0])
	nodeGossip := "127.0.0.1:" + strconv.Itoa(ports[1])
	opts := func(o *bench.Options) {
		if o.Addr != "" {
			return
		}
		o.DaemonArgs = append(o.DaemonArgs, "--listen", nodeAPI, "--insecure-no-auth", "--node-name", "bench-node", "--gossip", nodeGossip, "--gossip-key-file", kf.Name())
	}
	return runBenchOpts(cmd, bf, opts, func(ctx context.Context, env *bench.Env, _ uint64) (bench.Report, error) {
		if !env.Private {
			return nil, usagef("bench create --gateway starts its own node: do not pass --addr")
		}
		log := slog.New(slog.DiscardHandler)
		pool, err := membership.Join(membership.Options{Name: "bench-gateway", Meta: membership.Meta{Role: membership.RoleGateway},
			Bind: "127.0.0.1:" + strconv.Itoa(ports[2]), Peers: []string{nodeGossip}, Key: key, Logger: log})
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		gw := gateway.New(gateway.Options{Name: "bench-gateway", Members: pool, Logger: log})
		defer gw.Close()
		srv, err := server.New(server.Config{ListenAddr: "127.0.0.1:0", InsecureNoAuth: true, Logger: log})
		if err != nil {
			return nil, err
		}
		if err := srv.Listen(); err != nil {
			return nil, err
		}
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = srv.Serve(sctx, gw) }()
		gc, err := client.New("http://"+srv.Addrs()[0].String(), client.WithToken(""), client.WithUserAgent("warren-bench"))
		if err != nil {
			return nil, err
		}
		defer gc.Close()
		dc, err := client.New("http://"+nodeAPI, client.WithToken(""), client.WithUserAgent("warren-bench"))
		if err != nil {
			return nil, err
		}
		defer dc.Close()
		// The gateway places on the node once it has its first report.
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := gc.SystemService().NodeStatus(ctx, connect.NewRequest(&warrenv1.NodeStatusRequest{}))
			if err == nil && len(res.Msg.GetNodes()) == 1 && res.Msg.GetNodes()[0].GetUp() {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the gateway does not see the node up after 30s (%v)", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return bench.RunCreateGateway(ctx, env, cfg, gc, dc)
	})
}
