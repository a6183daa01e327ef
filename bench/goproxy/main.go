// The reference reverse proxy of `chainstate bench suite proxy`: Go's standard library
// httputil.ReverseProxy in front of one node, as a compiled baseline for the proxy's
// per-core cost. The suite builds it with the machine's `go` and runs it with GOMAXPROCS=1
// on the proxy's core. MaxIdleConnsPerHost is raised from Go's default of 2: with 2, it
// reconnects for almost every request under 64 connections and shows about half its rate.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8780", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:8700", "the node to forward to")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 256
	proxy.Transport = transport
	log.Printf("go reverse proxy on http://%s -> %s", *listen, *upstream)
	log.Fatal(http.ListenAndServe(*listen, proxy))
}
