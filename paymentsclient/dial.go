package paymentsclient

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ServiceConfig is the gRPC service config DialOptions sets: the
// round_robin load-balancing policy, which connects to every address the
// target resolves to and spreads calls over those that are ready. gRPC's
// default, pick_first, sends every call down one connection.
const ServiceConfig = `{"loadBalancingConfig": [{"round_robin": {}}]}`

// DialOptions returns the options DialTLS dials paymentsd with, less its
// credentials, for grpc.NewClient with credentials of your own:
//
//   - round_robin over every address of the target (ServiceConfig). Point
//     it at paymentsd's headless Service with the dns resolver
//     ("dns:///paymentsd-grpc.<namespace>.svc.cluster.local:9090"), whose
//     name resolves to every ready replica. gRPC looks the name up again
//     when a connection closes (at most every 30 s), and paymentsd closes
//     each connection gracefully after service.MaxConnectionAge (20 s), so
//     a replica added later gets its share of calls within 30 s of the
//     cluster's DNS answering with it (docs/client.md, "Spreading calls
//     over replicas").
//   - reconnection within 5 s at most after a lost connection (gRPC's
//     default waits up to 2 minutes, which a Create with a short deadline
//     would spend failing).
func DialOptions() []grpc.DialOption {
	reconnect := backoff.DefaultConfig
	reconnect.MaxDelay = 5 * time.Second
	return []grpc.DialOption{
		grpc.WithDefaultServiceConfig(ServiceConfig),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnect, MinConnectTimeout: 5 * time.Second}),
	}
}
