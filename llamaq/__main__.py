from llamaq.cli import main

main()
