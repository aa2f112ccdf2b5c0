"""The aggregation wire protocol: constants, the header (defined once), the Scapy layer and
the vectorized packer."""
