"""Shared-filesystem clients (NFS, Lustre, Storage Scale) and which tier a storage pool is."""
