// Package membership is the cluster's gossip pool: nodes and gateways
// join one hashicorp/memberlist pool (SWIM: each member probes others,
// suspects a silent one and declares it dead after a timeout that grows
// with log N), and each member's gossip metadata says what it is and
// where its API is. It is no consensus: nothing here is decided once for
// the cluster; a gateway combines what the pool says with what it pulls
// from each node (internal/gateway).
package membership

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Roles of members.
const (
	RoleNode    = "node"
	RoleGateway = "gateway"
)

// DefaultPort is memberlist's usual port.
const DefaultPort = 7946

// Meta is a member's gossip metadata. Kept small: memberlist carries at
// most 512 bytes of it in every alive message.
type Meta struct {
	Role string `json:"r"`
	API  string `json:"a,omitempty"` // the API's address, http://host:port
	Tag  string `json:"t,omitempty"` // a node's id tag
}

// Member is one member as the pool sees it now.
type Member struct {
	Name string
	Meta Meta
}

// Options configure Join.
type Options struct {
	Name string
	Meta Meta
	// Bind is the gossip address (UDP and TCP), host:port; Advertise the
	// address others reach it at (default: Bind's, when not 0.0.0.0).
	Bind, Advertise string
	// Peers are gossip addresses of members to join; empty starts a pool.
	// Joining is retried in the background until one answers.
	Peers []string
	// OnChange is called (without locks held) after a member joins,
	// leaves, fails or changes its metadata.
	OnChange func()
	// Key, when set, encrypts and authenticates every gossip message
	// (memberlist's AES-GCM keyring; its SHA-256 is the 32-byte key): a
	// member without it can neither join nor read the pool. Without it
	// anyone who reaches the gossip port can join as a node and receive
	// the gateways' calls (and their node token).
	Key    []byte
	Logger *slog.Logger
}

// Pool is this process's membership in the pool.
type Pool struct {
	ml   *memberlist.Memberlist
	o    Options
	stop chan struct{}
	wg   sync.WaitGroup
}

type delegate struct{ meta []byte }

func (d delegate) NodeMeta(int) []byte           { return d.meta }
func (delegate) NotifyMsg([]byte)                {}
func (delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (delegate) LocalState(bool) []byte          { return nil }
func (delegate) MergeRemoteState([]byte, bool)   {}

type events struct{ fn func() }

func (e events) NotifyJoin(*memberlist.Node)   { e.call() }
func (e events) NotifyLeave(*memberlist.Node)  { e.call() }
func (e events) NotifyUpdate(*memberlist.Node) { e.call() }
func (e events) call() {
	if e.fn != nil {
		go e.fn() // memberlist holds its locks while it notifies
	}
}

// Join starts this member's gossip and joins Peers.
func Join(o Options) (*Pool, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	meta, err := json.Marshal(o.Meta)
	if err != nil {
		return nil, err
	}
	if len(meta) > memberlist.MetaMaxSize {
		return nil, errdefs.Invalidf("gossip metadata of %d bytes: at most %d", len(meta), memberlist.MetaMaxSize)
	}
	c := memberlist.DefaultLANConfig()
	c.Name = o.Name
	host, port, err := splitHostPort(o.Bind)
	if err != nil {
		return nil, errdefs.Invalidf("gossip address %q: %v", o.Bind, err)
	}
	c.BindAddr, c.BindPort = host, port
	c.AdvertisePort = port
	if o.Advertise != "" {
		if c.AdvertiseAddr, c.AdvertisePort, err = splitHostPort(o.Advertise); err != nil {
			return nil, errdefs.Invalidf("gossip advertise address %q: %v", o.Advertise, err)
		}
	}
	if len(o.Key) > 0 {
		k := sha256.Sum256(o.Key)
		c.SecretKey = k[:]
		c.GossipVerifyIncoming, c.GossipVerifyOutgoing = true, true
	}
	c.Delegate = delegate{meta}
	c.Events = events{o.OnChange}
	// memberlist logs through the standard logger; its lines go to ours
	// at debug level (probes and suspicions are routine).
	c.Logger = log.New(slogWriter{o.Logger}, "", 0)
	ml, err := memberlist.Create(c)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.Unavailable, err, "start gossip on "+o.Bind)
	}
	p := &Pool{ml: ml, o: o, stop: make(chan struct{})}
	if len(o.Peers) > 0 {
		p.wg.Add(1)
		go p.joinLoop()
	}
	return p, nil
}

// joinLoop joins the peers, retrying until one answers: a node may start
// before any gateway, a gateway after a restart while its peers are busy.
func (p *Pool) joinLoop() {
	defer p.wg.Done()
	wait := 200 * time.Millisecond
	for {
		n, err := p.ml.Join(p.o.Peers)
		if n > 0 {
			p.o.Logger.Info("joined the cluster", "peers", strings.Join(p.o.Peers, ","), "members", p.ml.NumMembers())
			return
		}
		p.o.Logger.Debug("joining the cluster", "peers", strings.Join(p.o.Peers, ","), "err", err)
		select {
		case <-p.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Members returns the members the pool holds alive now (this one too).
func (p *Pool) Members() []Member {
	var out []Member
	for _, n := range p.ml.Members() {
		var m Meta
		if err := json.Unmarshal(n.Meta, &m); err != nil {
			continue // not one of ours
		}
		out = append(out, Member{Name: n.Name, Meta: m})
	}
	return out
}

// Addr is this member's gossip address.
func (p *Pool) Addr() string {
	n := p.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Close leaves the pool (telling the others, so they need not time it
// out) and stops gossiping.
func (p *Pool) Close() error {
	close(p.stop)
	p.wg.Wait()
	lerr := p.ml.Leave(2 * time.Second)
	if err := p.ml.Shutdown(); err != nil {
		return err
	}
	if lerr != nil {
		return fmt.Errorf("leave the cluster: %w", lerr)
	}
	return nil
}

func splitHostPort(s string) (string, int, error) {
	if s == "" {
		return "0.0.0.0", DefaultPort, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.l.Debug(strings.TrimSpace(string(b)), "component", "memberlist")
	return len(b), nil
}

var _ io.Writer = slogWriter{}
