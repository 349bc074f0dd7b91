package service

import (
	"context"
	"errors"
	"example.com/paymentsd/internal/engine"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errHardStop is the cause of a call's context when the drain deadline cut
// it off: the payment engine cuts off its request, if any.
var errHardStop = engine.ErrHardStop

// hardStopStream cancels a stream's context when the server's stop
// context ends, as unaryChain does a call's.
func (s *Server) hardStopStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.stopCtx, func() { cancel(errHardStop) })
	defer stop()
	err := handler(srv, &contextStream{ServerStream: ss, ctx: ctx})
	if err != nil && errors.Is(context.Cause(ctx), errHardStop) {
		err = stoppedStatus(err)
	}
	return err
}

// stoppedStatus turns the status of a call cut off by the drain deadline
// into UNAVAILABLE, keeping its details (ErrorInfo says whether a payment
// may have been created).
func stoppedStatus(err error) error {
	p := status.Convert(err).Proto()
	switch codes.Code(p.Code) {
	case codes.Canceled, codes.Unknown:
		p.Code = int32(codes.Unavailable)
		p.Message = "paymentsd shut down before the call finished: " + p.Message
	}
	return status.FromProto(p).Err()
}

// HardStop cancels every call still in progress; each returns promptly with
// paymentsd's own status. Call it when the drain deadline expires, then
// give handlers a moment to answer before closing connections.
func (s *Server) HardStop() { s.stop() }

type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *contextStream) Context() context.Context { return c.ctx }
