// stargz-grpc: a containerd remote snapshotter (what upstream's containerd-stargz-grpc is) over
// the stargz-snapshotter library Debian 12 packages (golang-github-containerd-stargz-snapshotter-dev
// 0.12): Debian ships ctr-remote but no snapshotter daemon. It serves fs.NewFilesystem under
// snapshot.NewSnapshotter as containerd's snapshots gRPC API on a unix socket, for a containerd with
//
//	[proxy_plugins.stargz]
//	  type = "snapshot"
//	  address = "<-address>"
//
// The library's service/ package is not used: it imports k8s.io/cri-api, which Debian does not package.
// Registries are reached anonymously: plain HTTP for localhost and 127.0.0.1 (the tests' and benches'
// loopback registry), HTTPS otherwise. -config takes the fs settings of upstream's config.toml
// (fs/config.Config: noprefetch, no_background_fetch, ...). Built by build.sh; scripts/host.sh runs it.
package main

import (
	"context"
	"flag"
	golog "log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/containerd/reference"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/containerd/snapshots/overlay/overlayutils"
	"github.com/containerd/stargz-snapshotter/fs"
	fsconfig "github.com/containerd/stargz-snapshotter/fs/config"
	"github.com/containerd/stargz-snapshotter/fs/layer"
	"github.com/containerd/stargz-snapshotter/fs/source"
	memorymetadata "github.com/containerd/stargz-snapshotter/metadata/memory"
	"github.com/containerd/stargz-snapshotter/snapshot"
	"github.com/pelletier/go-toml"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

var (
	address    = flag.String("address", "/run/imagebuild-stargz/stargz.sock", "unix socket for the snapshots gRPC service")
	configPath = flag.String("config", "", "optional TOML: the fs settings of upstream's config.toml")
	logLevel   = flag.String("log-level", "info", "log level [trace, debug, info, warn, error, fatal, panic]")
	rootDir    = flag.String("root", "/var/lib/imagebuild-stargz", "root directory for snapshots and the FUSE mounts")
)

// registryHosts: the reference's own host, anonymous; plain HTTP on loopback.
func registryHosts(ref reference.Spec) ([]docker.RegistryHost, error) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: http.DefaultTransport} // the library calls Transport itself
	scheme := "https"
	if local, _ := docker.MatchLocalhost(ref.Hostname()); local {
		scheme = "http"
	}
	return []docker.RegistryHost{{Client: client, Host: ref.Hostname(), Scheme: scheme, Path: "/v2",
		Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve,
		Authorizer:   docker.NewDockerAuthorizer(docker.WithAuthClient(client))}}, nil
}

func main() {
	flag.Parse()
	lvl, err := logrus.ParseLevel(*logLevel)
	if err != nil {
		logrus.WithError(err).Fatal("bad -log-level")
	}
	logrus.SetLevel(lvl)
	logrus.SetFormatter(&logrus.JSONFormatter{TimestampFormat: log.RFC3339NanoFixed})
	ctx := log.WithLogger(context.Background(), log.L)
	golog.SetOutput(log.G(ctx).WriterLevel(logrus.DebugLevel)) // go-fuse logs via std log

	var cfg fsconfig.Config
	if *configPath != "" {
		tree, err := toml.LoadFile(*configPath)
		if err == nil {
			err = tree.Unmarshal(&cfg)
		}
		if err != nil {
			log.G(ctx).WithError(err).Fatalf("failed to load config %q", *configPath)
		}
	}
	snRoot, fsRoot := filepath.Join(*rootDir, "snapshotter"), filepath.Join(*rootDir, "stargz")
	if err := overlayutils.Supported(snRoot); err != nil {
		log.G(ctx).WithError(err).Fatal("overlayfs-based snapshotter is not supported here")
	}
	opq := layer.OverlayOpaqueTrusted
	if userxattr, err := overlayutils.NeedsUserXAttr(snRoot); err == nil && userxattr {
		opq = layer.OverlayOpaqueUser
	}
	rfs, err := fs.NewFilesystem(fsRoot, cfg,
		fs.WithGetSources(source.FromDefaultLabels(registryHosts)),
		fs.WithOverlayOpaqueType(opq),
		fs.WithMetadataStore(memorymetadata.NewReader),
		fs.WithMetricsLogLevel(logrus.InfoLevel))
	if err != nil {
		log.G(ctx).WithError(err).Fatal("failed to create stargz filesystem")
	}
	sn, err := snapshot.NewSnapshotter(ctx, snRoot, rfs, snapshot.AsynchronousRemove)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("failed to create snapshotter")
	}

	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(sn))
	if err := os.MkdirAll(filepath.Dir(*address), 0700); err != nil {
		log.G(ctx).WithError(err).Fatal("failed to create socket directory")
	}
	_ = os.Remove(*address)
	l, err := net.Listen("unix", *address)
	if err != nil {
		log.G(ctx).WithError(err).Fatalf("failed to listen on %q", *address)
	}
	errCh := make(chan error, 1)
	go func() { errCh <- rpc.Serve(l) }()
	log.G(ctx).WithField("address", *address).WithField("root", *rootDir).Info("stargz-grpc serving")

	// Like upstream: SIGINT tears down (unmounts FUSE layers and deletes snapshot
	// contents, so delete -root afterwards); SIGTERM exits leaving state in place,
	// and the next start re-mounts the remote snapshots (restart-safe).
	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, unix.SIGINT, unix.SIGTERM)
	select {
	case s := <-sigCh:
		log.G(ctx).Infof("got %v, exiting", s)
		if s == unix.SIGINT {
			rpc.Stop()
			if err := sn.Close(); err != nil {
				log.G(ctx).WithError(err).Warn("cleanup failed")
			}
		}
	case err := <-errCh:
		log.G(ctx).WithError(err).Fatal("gRPC server stopped")
	}
}
