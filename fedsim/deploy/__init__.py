"""Deployment on Flower's Deployment Engine: node-local data and the census
(:mod:`fedsim.deploy.nodes`), the ServerApp's run configuration (:mod:`fedsim.deploy.runconfig`),
TLS certificates and SuperNode keys (:mod:`fedsim.deploy.certs`)."""
