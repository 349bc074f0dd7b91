package simulator

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body}

	s.mu.Lock()
	s.received++
	n := s.received
	if s.keepRequests {
		s.requests = append(s.requests, req)
	}
	script := s.script
	s.mu.Unlock()

	idemKey := idempotencyKey(body)
	via, _ := r.Context().Value(listenerKey{}).(string)
	kr := s.enter(idemKey, body, via)
	defer s.leave(idemKey, kr)

	var reply Reply
	if script != nil {
		reply = script(n, req)
	}
	s.mu.Lock()
	lateDedup, stubborn := s.lateDedup, s.stubborn
	s.mu.Unlock()
	var remembered *Reply
	if reply.Status == 0 {
		if lateDedup {
			remembered = s.completed(idemKey, req)
		} else {
			remembered = s.remember(idemKey, req, kr)
		}
	}
	// gone is closed when the client goes away, unless the fake is
	// stubborn: then it works on regardless, and only the reply is lost.
	gone := r.Context().Done()
	if stubborn {
		gone = nil
	}
	if reply.Delay > 0 {
		t := time.NewTimer(reply.Delay)
		select {
		case <-t.C:
		case <-gone:
			t.Stop()
			s.noteCanceled()
			return
		}
	}
	if reply.Wait != nil {
		select {
		case <-reply.Wait:
		case <-gone:
			s.noteCanceled()
			return
		}
	}
	if reply.Status == 0 && reply.Fault == NoFault {
		switch {
		case remembered != nil:
			reply = *remembered
		case lateDedup:
			reply = s.completeLate(idemKey, req, kr)
		default:
			reply = s.simulate(req, kr)
		}
	}
	if r.Context().Err() != nil {
		s.noteCanceled()
		return
	}
	s.send(w, r, reply, idemKey, kr)
}

func (s *Server) noteCanceled() {
	select {
	case s.canceled <- struct{}{}:
	default:
	}
}

// send writes reply, and notes in kr what was sent. Its last byte goes
// only once the fake is done with the request (see finish), so a client
// that has read the whole reply finds the request's history complete, and
// its next request is never counted as an overlap.
func (s *Server) send(w http.ResponseWriter, r *http.Request, reply Reply, key string, kr *KeyRequest) {
	status := reply.Status
	if status == 0 {
		status = http.StatusOK
	}
	switch reply.Fault {
	case Reset, Hangup, CutBody:
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(fmt.Sprintf("simulator: hijack: %v", err))
		}
		defer conn.Close()
		switch reply.Fault {
		case Reset:
			s.finish(key, kr, 0, false)
			// Under TLS, reset the TCP connection beneath: closing the
			// tls.Conn would first send close_notify, a clean end.
			raw := conn
			if tc, ok := conn.(*tls.Conn); ok {
				raw = tc.NetConn()
			}
			if tc, ok := raw.(*net.TCPConn); ok {
				tc.SetLinger(0)
				tc.Close()
			}
		case Hangup:
			s.finish(key, kr, 0, false)
		case CutBody:
			s.finish(key, kr, status, false)
			fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
				status, http.StatusText(status), len(reply.Body))
			buf.Write(reply.Body[:len(reply.Body)/2])
			buf.Flush()
		}
		return
	}

	for k, vs := range reply.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(reply.Body)))
	s.mu.Lock()
	kr.Status = status
	s.mu.Unlock()
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	head, tail := reply.Body, []byte(nil)
	if n := len(reply.Body); n > 0 {
		head, tail = reply.Body[:n-1], reply.Body[n-1:]
	}
	written := true
	if reply.Fault == Dribble {
		for i := range head {
			if _, err := w.Write(head[i : i+1]); err != nil || rc.Flush() != nil {
				written = false
			}
			t := time.NewTimer(reply.DribbleInterval)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				s.noteCanceled()
				return
			}
		}
	} else if len(head) > 0 {
		_, err := w.Write(head)
		written = err == nil && rc.Flush() == nil
	}
	success := status >= 200 && status <= 299
	s.finish(key, kr, status, written && success)
	if _, err := w.Write(tail); (err != nil || rc.Flush() != nil) && written && success {
		s.undeliver(key, kr)
	}
}
